//! Renewal: one driver task per client keeps every held lock alive, in batches.
//!
//! A lock's renewal is due after its renew interval, and never later than one request timeout
//! before its validity deadline, so a slow grant or a long interval still leaves time for a
//! renewal to be confirmed. Due locks are sent together (one pipeline per node and chunk), so
//! 10,000 held locks cost a few round trips per tick, not 10,000 tasks. Each lock's outcome is
//! applied as soon as it arrives; a lock is declared lost when a node answers "not yours" (a
//! quorum, for Redlock) or when its validity deadline passes without a confirmed renewal; one
//! failed request is retried, not a loss.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use crate::backend::{Backend, ExtendOutcome, OwnedExtendItem};
use crate::config::Settings;
use crate::events;
use crate::hold::Hold;

/// Renewals due within this much of each other go out in the same batch.
const BATCH_WINDOW: Duration = Duration::from_millis(20);

/// Joining locks wake the driver early once this many wait to be picked up.
const JOIN_BACKLOG: usize = 4096;
/// How often an idle driver looks at the locks that joined.
const IDLE_TICK: Duration = Duration::from_secs(1);

/// The handle locks use to join the client's renewal driver.
///
/// Joining does not wake the driver unless the new lock's first renewal is due before the
/// driver's next wake-up; a released lock is flagged and dropped when the driver next looks at it.
/// Taking and releasing a lock thus costs the driver nothing, and the driver wakes about once per
/// renewal period however many locks come and go.
pub(crate) struct Renewer {
    shared: Arc<Shared>,
}

struct Shared {
    /// Locks that joined since the driver last looked, with when they joined: their renewals
    /// are scheduled from then, however late the driver gets to them.
    joining: Mutex<Vec<(Arc<Hold>, Instant)>>,
    wake: Notify,
    /// The driver's next wake-up in ms since `epoch` (`u64::MAX` until it first runs).
    next_wake_ms: AtomicU64,
    epoch: Instant,
    closed: AtomicBool,
    /// Whether the driver task still exists: false once it ended or its runtime dropped it (a
    /// runtime the caller passed in, shut down).
    running: AtomicBool,
    settings: Settings,
}

impl Shared {
    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    fn take_joining(&self) -> Vec<(Arc<Hold>, Instant)> {
        std::mem::take(&mut *self.joining.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn renew_at(&self, hold: &Hold, now: Instant) -> Instant {
        let remaining = Instant::from_std(hold.valid_until()).saturating_duration_since(now);
        now + self.settings.renew_after(hold.ttl, remaining)
    }
}

impl Renewer {
    /// Starts the driver on the current runtime (the client's).
    pub(crate) fn start(backend: Arc<Backend>, settings: Settings) -> Self {
        let shared = Arc::new(Shared {
            joining: Mutex::new(Vec::new()),
            wake: Notify::new(),
            next_wake_ms: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
            closed: AtomicBool::new(false),
            running: AtomicBool::new(true),
            settings,
        });
        let (results_tx, results) = mpsc::unbounded_channel();
        let driver = Driver {
            _running: Running(Arc::clone(&shared)),
            shared: Arc::clone(&shared),
            backend,
            entries: HashMap::new(),
            timers: BTreeSet::new(),
            results_tx,
            results,
        };
        tokio::spawn(driver.run());
        Renewer { shared }
    }

    /// Whether the driver still runs, so a lock that joins now will be renewed.
    pub(crate) fn is_running(&self) -> bool {
        self.shared.running.load(Ordering::Acquire)
    }

    /// Keeps `hold` alive until it is released or lost.
    pub(crate) fn register(&self, hold: Arc<Hold>) {
        // Scheduled from the grant, a moment ago (earlier than now: never late), which saves a
        // clock read per lock.
        let joined = Instant::from_std(hold.acquired_at());
        let mut first = self.shared.renew_at(&hold, joined);
        if let Some(stop) = hold.max_hold_at() {
            first = first.min(Instant::from_std(stop));
        }
        let backlog = loop {
            let mut joining = self
                .shared
                .joining
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // Locks released since they joined go here, on the thread that took them, rather
            // than when the driver next looks (freeing on another thread contends in malloc),
            // one at a time outside the lock (a list of them would cost an allocation per lock).
            if joining.last().is_some_and(|(h, _)| h.is_released()) {
                let gone = joining.pop();
                drop(joining);
                drop(gone);
                continue;
            }
            joining.push((hold, joined));
            break joining.len();
        };
        let first = self.shared.ms(first);
        // Read after queueing: the driver publishes its wake-up before it looks at the queue, so
        // either it sees this lock or this sees the wake-up it settled on.
        if first < self.shared.next_wake_ms.load(Ordering::SeqCst) || backlog >= JOIN_BACKLOG {
            self.shared.wake.notify_one();
        }
    }
}

/// Lowers `running` when the driver is dropped, however that happens.
struct Running(Arc<Shared>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
    }
}

struct Entry {
    hold: Arc<Hold>,
    /// When the next extension should be sent.
    renew_at: Instant,
    in_flight: bool,
    /// This entry's key in `timers`.
    timer: Instant,
}

impl Entry {
    fn wake_at(&self) -> Instant {
        let valid_until = Instant::from_std(self.hold.valid_until());
        let at = if self.in_flight {
            valid_until
        } else {
            self.renew_at.min(valid_until)
        };
        match self.hold.max_hold_at() {
            Some(stop) => at.min(Instant::from_std(stop)),
            None => at,
        }
    }
}

/// One lock's renewal outcome: its id, when the extension was sent, and the answer.
type Outcome = (u64, Instant, ExtendOutcome);

struct Driver {
    _running: Running,
    shared: Arc<Shared>,
    backend: Arc<Backend>,
    entries: HashMap<u64, Entry>,
    /// (wake-up time, lock id), one per entry.
    timers: BTreeSet<(Instant, u64)>,
    results_tx: mpsc::UnboundedSender<Outcome>,
    results: mpsc::UnboundedReceiver<Outcome>,
}

impl Driver {
    async fn run(mut self) {
        loop {
            // Idle, it still looks in every IDLE_TICK: a lock that joins meanwhile and is due
            // later needs no wake-up, so taking and releasing locks while none is held does not
            // wake this task each time.
            let next = self
                .timers
                .first()
                .map_or_else(|| Instant::now() + IDLE_TICK, |(at, _)| *at);
            self.shared
                .next_wake_ms
                .store(self.shared.ms(next), Ordering::SeqCst);
            let joined = self.shared.take_joining();
            if joined.is_empty() {
                tokio::select! {
                    () = self.shared.wake.notified() => {}
                    Some(outcome) = self.results.recv() => self.apply(outcome),
                    () = tokio::time::sleep_until(next) => {}
                }
            } else {
                self.insert(joined);
            }
            if self.shared.closed.load(Ordering::SeqCst) {
                return;
            }
            // Confirmed renewals first: one that arrived must never lose against the deadline.
            while let Ok(outcome) = self.results.try_recv() {
                self.apply(outcome);
            }
            let joined = self.shared.take_joining();
            self.insert(joined);
            self.tick(Instant::now());
        }
    }

    /// Takes over newly held locks; those released meanwhile (most short ones) are just dropped.
    fn insert(&mut self, joined: Vec<(Arc<Hold>, Instant)>) {
        let now = Instant::now();
        for (hold, joined_at) in joined {
            if hold.is_released() || hold.is_declared_lost() {
                continue;
            }
            let id = hold.id;
            let mut entry = Entry {
                renew_at: self.shared.renew_at(&hold, joined_at),
                hold,
                in_flight: false,
                timer: now,
            };
            entry.timer = entry.wake_at();
            self.timers.insert((entry.timer, id));
            self.entries.insert(id, entry);
        }
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
            let Some(entry) = self.entries.get_mut(&id) else {
                continue;
            };
            if entry.hold.is_released() || entry.hold.is_declared_lost() {
                self.remove(id);
                continue;
            }
            if entry.hold.check_lost() {
                self.remove(id);
                continue;
            }
            if entry
                .hold
                .max_hold_at()
                .is_some_and(|stop| Instant::from_std(stop) <= now)
            {
                // Renewal stops here; the holder is told to stop and releases.
                entry.hold.pass_max_hold();
                self.remove(id);
                continue;
            }
            let slack = BATCH_WINDOW.min(self.shared.settings.renew_every(entry.hold.ttl) / 4);
            if !entry.in_flight && entry.renew_at <= now + slack {
                entry.in_flight = true;
                due.push(Arc::clone(&entry.hold));
            }
            self.reschedule(id);
        }
        if due.is_empty() {
            return;
        }
        let backend = Arc::clone(&self.backend);
        let results = self.results_tx.clone();
        tokio::spawn(async move {
            let sent = Instant::now();
            let items: Arc<[OwnedExtendItem]> = due
                .iter()
                .map(|hold| OwnedExtendItem {
                    names: Arc::clone(&hold.names),
                    token: hold.token.clone(),
                    ttl: hold.ttl,
                    mode: hold.mode,
                })
                .collect();
            backend
                .extend_many(items, &mut |i, outcome| {
                    let _ = results.send((due[i].id, sent, outcome));
                })
                .await;
        });
    }

    fn apply(&mut self, (id, sent, outcome): Outcome) {
        let settings = &self.shared.settings;
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        let hold = Arc::clone(&entry.hold);
        if hold.is_released() {
            // Released while the extension was in flight: a "not ours" may be that very release.
            self.remove(id);
            return;
        }
        entry.in_flight = false;
        let now = Instant::now();
        match outcome {
            ExtendOutcome::Extended => {
                let until = sent + hold.ttl.saturating_sub(settings.drift(hold.ttl));
                hold.confirm(until.into_std());
                events::renewed(&hold.labels, now - sent);
                if hold.check_lost() {
                    self.remove(id);
                    return;
                }
                entry.renew_at = self.shared.renew_at(&hold, sent.max(now));
            }
            ExtendOutcome::NotOwned { index } => {
                hold.declare_lost(index, "the lock is no longer ours");
                self.remove(id);
                return;
            }
            ExtendOutcome::Failed(cause) => {
                events::renewal_failed(hold.name(), &cause);
                let every = settings.renew_every(hold.ttl);
                entry.renew_at = now + (every / 4).max(Duration::from_millis(5));
            }
        }
        self.reschedule(id);
    }
}
