//! Renewal: one driver task per client keeps every held lock alive, in batches.
//!
//! Each lock is extended every `renew_every(ttl)`; due locks are sent together (one pipeline per
//! node and chunk), so 10,000 held locks cost a few round trips per tick, not 10,000 tasks. A lock
//! is declared lost when a node answers "not yours" (a quorum, in Redlock mode) or when its validity
//! deadline passes without a confirmed extension; one failed request is retried, not a loss.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::{Backend, ExtendOutcome};
use crate::config::Settings;
use crate::guard::Held;

/// Renewals due within this much of each other go out in the same batch.
const BATCH_WINDOW: Duration = Duration::from_millis(20);

enum Command {
    Register(Arc<Held>, Instant),
    Unregister(u64),
}

/// The handle locks use to join and leave the client's renewal driver.
pub(crate) struct Renewer {
    commands: mpsc::UnboundedSender<Command>,
}

impl Renewer {
    /// Starts the driver on the current runtime (the library's).
    pub(crate) fn start(backend: Arc<Backend>, settings: Arc<Settings>) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        let driver = Driver {
            backend,
            settings,
            entries: HashMap::new(),
            timers: BTreeSet::new(),
            in_flight: JoinSet::new(),
        };
        tokio::spawn(driver.run(rx));
        Renewer { commands }
    }

    /// Keeps `held` alive until unregistered; it is valid until `valid_until` as of now.
    pub(crate) fn register(&self, held: Arc<Held>, valid_until: std::time::Instant) {
        let _ = self
            .commands
            .send(Command::Register(held, Instant::from_std(valid_until)));
    }

    pub(crate) fn unregister(&self, id: u64) {
        let _ = self.commands.send(Command::Unregister(id));
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
    backend: Arc<Backend>,
    settings: Arc<Settings>,
    entries: HashMap<u64, Entry>,
    /// (wake-up time, lock id), one per entry.
    timers: BTreeSet<(Instant, u64)>,
    in_flight: JoinSet<BatchResult>,
}

impl Driver {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            let next = self.timers.first().map(|(at, _)| *at);
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::Register(held, valid_until)) => self.insert(held, valid_until),
                    Some(Command::Unregister(id)) => self.remove(id),
                    None => return,
                },
                Some(done) = self.in_flight.join_next(), if !self.in_flight.is_empty() => {
                    if let Ok(results) = done {
                        self.apply(results);
                    }
                }
                () = sleep_until(next) => {}
            }
            self.tick(Instant::now());
        }
    }

    fn insert(&mut self, held: Arc<Held>, valid_until: Instant) {
        let renew_at = Instant::now() + self.settings.renew_every(held.ttl);
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

    fn remove(&mut self, id: u64) {
        if let Some(entry) = self.entries.remove(&id) {
            self.timers.remove(&(entry.timer, id));
        }
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
            let Some(entry) = self.entries.get_mut(&id) else {
                // Released (or declared lost) while the extension was in flight.
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
