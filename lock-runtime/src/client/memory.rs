//! Locks inside this process, with the same contract as Redis: expiry, renewal, fencing and
//! release wake-ups. Nothing is shared with other processes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{Attempt, LockKeys, Token};
use crate::wait::WakeRegistry;

#[derive(Debug)]
pub(crate) struct MemoryStore {
    state: Mutex<State>,
    wakers: Arc<WakeRegistry>,
}

#[derive(Debug, Default)]
struct State {
    held: HashMap<String, Entry>,
    fences: HashMap<String, u64>,
}

#[derive(Debug)]
struct Entry {
    token: Token,
    expires: Instant,
}

impl State {
    /// The live entry of `key`, dropping it first when it has expired.
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Entry> {
        if self.held.get(key).is_some_and(|e| e.expires <= now) {
            self.held.remove(key);
        }
        self.held.get_mut(key)
    }
}

impl MemoryStore {
    pub(crate) fn new(wakers: Arc<WakeRegistry>) -> Self {
        MemoryStore {
            state: Mutex::new(State::default()),
            wakers,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn acquire(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
        fencing: bool,
    ) -> Attempt {
        let now = Instant::now();
        let mut state = self.state();
        match state.live(&keys.lock, now) {
            Some(entry) if entry.token == *token => {
                entry.expires = now + ttl;
                let fence = state.fences.get(&keys.fence).copied();
                Attempt::Acquired {
                    fence: fence.filter(|_| fencing),
                }
            }
            Some(entry) => Attempt::Held {
                pttl: Some(entry.expires - now),
            },
            None => {
                state.held.insert(
                    keys.lock.clone(),
                    Entry {
                        token: token.clone(),
                        expires: now + ttl,
                    },
                );
                let fence = fencing.then(|| {
                    // Like Redis: a new counter starts from the clock in microseconds, so tokens
                    // still grow across a restart of the process.
                    let counter = state
                        .fences
                        .entry(keys.fence.clone())
                        .or_insert_with(clock_micros);
                    *counter += 1;
                    *counter
                });
                Attempt::Acquired { fence }
            }
        }
    }

    pub(crate) fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> bool {
        let now = Instant::now();
        match self.state().live(&keys.lock, now) {
            Some(entry) if entry.token == *token => {
                entry.expires = now + ttl;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn release(&self, keys: &LockKeys, token: &Token) -> bool {
        let ours = {
            let mut state = self.state();
            let ours = state
                .live(&keys.lock, Instant::now())
                .is_some_and(|entry| entry.token == *token);
            if ours {
                state.held.remove(&keys.lock);
            }
            ours
        };
        if ours {
            self.wakers.notify(&keys.channel);
        }
        ours
    }
}

fn clock_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
