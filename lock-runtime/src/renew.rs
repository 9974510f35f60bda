//! Renewal: one driver task per client keeps every held lock alive, in batches.
//!
//! Each lock is extended every `renew_every(ttl)`; due locks are sent together (one pipeline per
//! node and chunk), so 10,000 held locks cost a few round trips per tick, not 10,000 tasks. A lock
//! is declared lost when a node answers "not yours" (a quorum, in Redlock mode) or when its validity
//! deadline passes without a confirmed extension; one failed request is retried, not a loss.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::{Backend, ExtendOutcome};
use crate::config::Settings;
use crate::guard::Held;

/// Renewals due within this much of each other go out in the same batch.
const BATCH_WINDOW: Duration = Duration::from_millis(20);

/// Joining locks wake the driver early once this many wait to be picked up.
const JOIN_BACKLOG: usize = 4096;

/// The handle locks use to join and leave the client's renewal driver.
///
/// Joining and leaving do not wake the driver: a new lock is queued, and wakes the driver only
/// when its first renewal is due before the driver's next wake-up; a released lock is flagged and
/// dropped when the driver next looks at it. Taking and releasing a lock thus costs the driver
/// nothing, and the driver wakes about once per renewal period however many locks come and go.
pub(crate) struct Renewer {
    shared: Arc<Shared>,
}

/// A lock waiting to be picked up by the driver: its validity deadline and first renewal.
struct Joining {
    held: Arc<Held>,
    valid_until: Instant,
    renew_at: Instant,
}

struct Shared {
    joining: Mutex<Vec<Joining>>,
    wake: Notify,
    /// The driver's next wake-up in ms since `epoch` (`u64::MAX`: none).
    next_wake_ms: AtomicU64,
    epoch: Instant,
    closed: AtomicBool,
}

impl Shared {
    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    fn take_joining(&self) -> Vec<Joining> {
        std::mem::take(&mut *self.joining.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Renewer {
    /// Starts the driver on the current runtime (the client's).
    pub(crate) fn start(backend: Arc<Backend>, settings: Arc<Settings>) -> Self {
        let shared = Arc::new(Shared {
            joining: Mutex::new(Vec::new()),
            wake: Notify::new(),
            next_wake_ms: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
            closed: AtomicBool::new(false),
        });
        let driver = Driver {
            shared: Arc::clone(&shared),
            backend,
            settings,
            entries: HashMap::new(),
            timers: BTreeSet::new(),
            in_flight: JoinSet::new(),
        };
        tokio::spawn(driver.run());
        Renewer { shared }
    }

    /// Keeps `held` alive until it is released; it is valid until `valid_until` as of now.
    pub(crate) fn register(
        &self,
        held: Arc<Held>,
        valid_until: std::time::Instant,
        every: Duration,
    ) {
        let renew_at = Instant::now() + every;
        let backlog = {
            let mut joining = self
                .shared
                .joining
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            joining.push(Joining {
                held,
                valid_until: Instant::from_std(valid_until),
                renew_at,
            });
            joining.len()
        };
        let renew_at = self.shared.ms(renew_at);
        // Read after queueing: the driver publishes its wake-up before it looks at the queue, so
        // either it sees this lock or this sees the wake-up it settled on.
        if renew_at < self.shared.next_wake_ms.load(Ordering::SeqCst) || backlog >= JOIN_BACKLOG {
            self.shared.wake.notify_one();
        }
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
    }
}

struct Entry {
    held: Arc<Held>,
    /// Validity deadline: past it without a confirmed extension, the lock is lost.
    valid_until: Instant,
    /// When the next extension should be sent.
    renew_at: Instant,
    in_flight: bool,
    /// This entry's key in `timers`.
    timer: Instant,
}

impl Entry {
    fn wake_at(&self) -> Instant {
        if self.in_flight {
            self.valid_until
        } else {
            self.renew_at.min(self.valid_until)
        }
    }
}

type BatchResult = Vec<(u64, Instant, ExtendOutcome)>;

struct Driver {
    shared: Arc<Shared>,
    backend: Arc<Backend>,
    settings: Arc<Settings>,
    entries: HashMap<u64, Entry>,
    /// (wake-up time, lock id), one per entry.
    timers: BTreeSet<(Instant, u64)>,
    in_flight: JoinSet<BatchResult>,
}

impl Driver {
    async fn run(mut self) {
        loop {
            let next = self.timers.first().map(|(at, _)| *at);
            self.shared.next_wake_ms.store(
                next.map_or(u64::MAX, |at| self.shared.ms(at)),
                Ordering::SeqCst,
            );
            let joined = self.shared.take_joining();
            if joined.is_empty() {
                tokio::select! {
                    () = self.shared.wake.notified() => {}
                    Some(done) = self.in_flight.join_next(), if !self.in_flight.is_empty() => {
                        if let Ok(results) = done {
                            self.apply(results);
                        }
                    }
                    () = sleep_until(next) => {}
                }
            } else {
                self.insert(joined);
            }
            if self.shared.closed.load(Ordering::SeqCst) {
                return;
            }
            let joined = self.shared.take_joining();
            self.insert(joined);
            self.tick(Instant::now());
        }
    }

    /// Takes over newly held locks; those released meanwhile (most short ones) are just dropped.
    fn insert(&mut self, joined: Vec<Joining>) {
        for Joining {
            held,
            valid_until,
            renew_at,
        } in joined
        {
            if held.released.load(Ordering::Acquire) {
                continue;
            }
            let id = held.id;
            let entry = Entry {
                held,
                valid_until,
                renew_at,
                in_flight: false,
                timer: renew_at.min(valid_until),
            };
            self.timers.insert((entry.timer, id));
            self.entries.insert(id, entry);
        }
    }

    fn remove(&mut self, id: u64) {
        if let Some(entry) = self.entries.remove(&id) {
            self.timers.remove(&(entry.timer, id));
        }
    }

    fn is_released(&self, id: u64) -> bool {
        self.entries
            .get(&id)
            .is_none_or(|entry| entry.held.released.load(Ordering::Acquire))
    }

    fn reschedule(&mut self, id: u64) {
        if let Some(entry) = self.entries.get_mut(&id) {
            self.timers.remove(&(entry.timer, id));
            entry.timer = entry.wake_at();
            self.timers.insert((entry.timer, id));
        }
    }

    fn lose(&mut self, id: u64, why: &str) {
        if let Some(entry) = self.entries.remove(&id) {
            self.timers.remove(&(entry.timer, id));
            tracing::warn!(key = %entry.held.keys.name, why, "lock lost");
            entry.held.lost.cancel();
        }
    }

    /// Declares expired locks lost and sends the extensions that are due (or nearly).
    fn tick(&mut self, now: Instant) {
        let horizon = now + BATCH_WINDOW;
        let candidates: Vec<u64> = self
            .timers
            .iter()
            .take_while(|(at, _)| *at <= horizon)
            .map(|(_, id)| *id)
            .collect();
        let mut due = Vec::new();
        for id in candidates {
            if self.is_released(id) {
                self.remove(id);
                continue;
            }
            let Some(entry) = self.entries.get(&id) else {
                continue;
            };
            if entry.valid_until <= now {
                self.lose(id, "validity deadline passed without a confirmed renewal");
                continue;
            }
            let slack = BATCH_WINDOW.min(self.settings.renew_every(entry.held.ttl) / 4);
            if !entry.in_flight && entry.renew_at <= now + slack {
                due.push(Arc::clone(&entry.held));
                if let Some(entry) = self.entries.get_mut(&id) {
                    entry.in_flight = true;
                }
                self.reschedule(id);
            }
        }
        if due.is_empty() {
            return;
        }
        let backend = Arc::clone(&self.backend);
        self.in_flight.spawn(async move {
            let sent = Instant::now();
            let items: Vec<_> = due
                .iter()
                .map(|held| (&*held.keys, &held.token, held.ttl))
                .collect();
            let outcomes = backend.extend_many(&items).await;
            due.iter()
                .zip(outcomes)
                .map(|(held, outcome)| (held.id, sent, outcome))
                .collect()
        });
    }

    fn apply(&mut self, results: BatchResult) {
        let now = Instant::now();
        for (id, sent, outcome) in results {
            if self.is_released(id) {
                // Released (or declared lost) while the extension was in flight: a "not ours"
                // may be that very release.
                self.remove(id);
                continue;
            }
            let Some(entry) = self.entries.get_mut(&id) else {
                continue;
            };
            entry.in_flight = false;
            let ttl = entry.held.ttl;
            let every = self.settings.renew_every(ttl);
            match outcome {
                ExtendOutcome::Extended => {
                    entry.valid_until = sent + ttl.saturating_sub(self.settings.drift(ttl));
                    entry.renew_at = sent + every;
                }
                ExtendOutcome::NotOwned => {
                    self.lose(id, "the lock is no longer ours");
                    continue;
                }
                ExtendOutcome::Failed(cause) => {
                    tracing::debug!(key = %entry.held.keys.name, %cause, "renewal failed; retrying");
                    entry.renew_at = now + (every / 4).max(Duration::from_millis(5));
                }
            }
            self.reschedule(id);
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
