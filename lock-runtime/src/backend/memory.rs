//! Locks inside this process, with the same contract as Redis: expiry, renewal, fencing and
//! release wake-ups. Nothing is shared with other processes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{Attempt, BoxFuture, ExtendItem, ExtendOutcome, Node, NodeView, Subscription, Token};
use crate::error::NodeFailure;
use crate::wait::WakeRegistry;

#[derive(Debug)]
pub(crate) struct MemoryNode {
    state: Mutex<State>,
    wakers: Arc<WakeRegistry>,
}

#[derive(Debug, Default)]
struct State {
    held: HashMap<Arc<str>, Entry>,
    fences: HashMap<Arc<str>, u64>,
    /// `held.len()` after the last sweep of expired entries.
    swept_at: usize,
}

#[derive(Debug)]
struct Entry {
    token: Token,
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

    /// Drops expired entries once the table doubled since the last sweep, so locks that are never
    /// released (crashed holders, in Redis terms) do not accumulate.
    fn sweep(&mut self, now: Instant) {
        if self.held.len() >= 2 * self.swept_at.max(512) {
            self.held.retain(|_, e| e.expires > now);
            self.swept_at = self.held.len();
        }
    }
}

impl MemoryNode {
    pub(crate) fn new(wakers: Arc<WakeRegistry>) -> Self {
        MemoryNode {
            state: Mutex::new(State::default()),
            wakers,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn acquire_now(
        &self,
        names: &[Arc<str>],
        token: &Token,
        ttl: Duration,
        fencing: bool,
    ) -> Attempt {
        let now = Instant::now();
        let expires = now.checked_add(ttl).unwrap_or(now + lock_rules::MAX_TTL);
        let mut state = self.state();
        state.sweep(now);
        let mut ours = Vec::with_capacity(names.len());
        for (index, name) in names.iter().enumerate() {
            match state.live(name, now) {
                Some(entry) if entry.token == *token => ours.push(true),
                Some(entry) => {
                    return Attempt::Held {
                        index,
                        pttl: Some(entry.expires - now),
                    };
                }
                None => ours.push(false),
            }
        }
        let mut fences = Vec::new();
        for (name, ours) in names.iter().zip(ours) {
            state.held.insert(
                Arc::clone(name),
                Entry {
                    token: token.clone(),
                    expires,
                },
            );
            if fencing {
                fences.push(next_fence(&mut state, name, !ours));
            }
        }
        Attempt::Acquired { fences }
    }

    fn extend_now(&self, item: &ExtendItem<'_>) -> ExtendOutcome {
        let now = Instant::now();
        let mut state = self.state();
        for (index, name) in item.names.iter().enumerate() {
            if !state
                .live(name, now)
                .is_some_and(|entry| entry.token == *item.token)
            {
                return ExtendOutcome::NotOwned { index };
            }
        }
        for name in item.names {
            if let Some(entry) = state.held.get_mut(&**name) {
                entry.expires = now.checked_add(item.ttl).unwrap_or(entry.expires);
            }
        }
        ExtendOutcome::Extended
    }

    fn release_now(&self, names: &[Arc<str>], token: &Token, wake: bool) -> bool {
        let now = Instant::now();
        let mut released = Vec::with_capacity(names.len());
        {
            let mut state = self.state();
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
        if wake {
            for name in &released {
                self.wakers.notify(name);
            }
        }
        released.len() == names.len()
    }
}

/// Like Redis: a new counter starts from the clock in microseconds, so tokens still grow across
/// a restart of the process. `bump` is false for a same-token retry, which answers the current
/// value.
fn next_fence(state: &mut State, name: &str, bump: bool) -> u64 {
    let counter = match state.fences.get_mut(name) {
        Some(counter) => counter,
        None => state.fences.entry(name.into()).or_insert_with(clock_micros),
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
    ) -> BoxFuture<'a, Result<Option<NodeView>, NodeFailure>> {
        let now = Instant::now();
        let mut state = self.state();
        let remaining = state.live(name, now).map(|entry| entry.expires - now);
        let view = remaining.map(|remaining| NodeView {
            remaining: Some(remaining),
            fence: state.fences.get(name).copied(),
        });
        Box::pin(std::future::ready(Ok(view)))
    }

    fn force_release<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        let held = {
            let mut state = self.state();
            let held = state.live(name, Instant::now()).is_some();
            state.held.remove(name);
            held
        };
        if held {
            self.wakers.notify(name);
        }
        Box::pin(std::future::ready(Ok(held)))
    }

    fn acquire<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        ttl: Duration,
        fencing: bool,
    ) -> BoxFuture<'a, Result<Attempt, NodeFailure>> {
        let attempt = self.acquire_now(names, token, ttl, fencing);
        Box::pin(std::future::ready(Ok(attempt)))
    }

    fn extend_many<'a>(&'a self, items: &'a [ExtendItem<'a>]) -> BoxFuture<'a, Vec<ExtendOutcome>> {
        let outcomes = items.iter().map(|item| self.extend_now(item)).collect();
        Box::pin(std::future::ready(outcomes))
    }

    fn release<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        wake: bool,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        let ours = self.release_now(names, token, wake);
        Box::pin(std::future::ready(Ok(ours)))
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

    fn watch(&self, _name: &str) -> Subscription {
        // Releases notify the client's wake registry directly: nothing to set up.
        Subscription {
            confirmed: Box::pin(std::future::ready(true)),
            keep: None,
        }
    }
}

fn clock_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
