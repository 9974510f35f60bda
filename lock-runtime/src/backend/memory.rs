//! Locks inside this process, with the same contract as Redis: expiry, renewal, fencing and
//! release wake-ups. Nothing is shared with other processes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{Attempt, BoxFuture, ExtendItem, ExtendOutcome, Node, Subscription, Token};
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

    fn acquire_now(&self, name: &str, token: &Token, ttl: Duration, fencing: bool) -> Attempt {
        let now = Instant::now();
        let expires = now.checked_add(ttl).unwrap_or(now + lock_rules::MAX_TTL);
        let mut state = self.state();
        state.sweep(now);
        match state.live(name, now) {
            Some(entry) if entry.token == *token => {
                entry.expires = expires;
                Attempt::Acquired {
                    fence: fencing.then(|| next_fence(&mut state, name, false)),
                }
            }
            Some(entry) => Attempt::Held {
                pttl: Some(entry.expires - now),
            },
            None => {
                let name: Arc<str> = name.into();
                state.held.insert(
                    Arc::clone(&name),
                    Entry {
                        token: token.clone(),
                        expires,
                    },
                );
                Attempt::Acquired {
                    fence: fencing.then(|| next_fence(&mut state, &name, true)),
                }
            }
        }
    }

    fn extend_now(&self, item: &ExtendItem<'_>) -> ExtendOutcome {
        let now = Instant::now();
        match self.state().live(item.name, now) {
            Some(entry) if entry.token == *item.token => {
                entry.expires = now.checked_add(item.ttl).unwrap_or(entry.expires);
                ExtendOutcome::Extended
            }
            _ => ExtendOutcome::NotOwned,
        }
    }

    fn release_now(&self, name: &str, token: &Token, wake: bool) -> bool {
        let ours = {
            let mut state = self.state();
            let ours = state
                .live(name, Instant::now())
                .is_some_and(|entry| entry.token == *token);
            if ours {
                state.held.remove(name);
            }
            ours
        };
        if ours && wake {
            self.wakers.notify(name);
        }
        ours
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
    fn acquire<'a>(
        &'a self,
        name: &'a str,
        token: &'a Token,
        ttl: Duration,
        fencing: bool,
    ) -> BoxFuture<'a, Result<Attempt, NodeFailure>> {
        let attempt = self.acquire_now(name, token, ttl, fencing);
        Box::pin(std::future::ready(Ok(attempt)))
    }

    fn extend_many<'a>(&'a self, items: &'a [ExtendItem<'a>]) -> BoxFuture<'a, Vec<ExtendOutcome>> {
        let outcomes = items.iter().map(|item| self.extend_now(item)).collect();
        Box::pin(std::future::ready(outcomes))
    }

    fn release<'a>(
        &'a self,
        name: &'a str,
        token: &'a Token,
        wake: bool,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        let ours = self.release_now(name, token, wake);
        Box::pin(std::future::ready(Ok(ours)))
    }

    fn raise_fence<'a>(
        &'a self,
        name: &'a str,
        fence: u64,
    ) -> BoxFuture<'a, Result<(), NodeFailure>> {
        let mut state = self.state();
        let counter = next_fence(&mut state, name, false);
        if counter < fence {
            state.fences.insert(name.into(), fence);
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
