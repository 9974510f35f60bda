//! The engine behind a client: its backend, renewal driver, wake registry, the locks it holds,
//! and the background work (releases) still running. Every lock operation goes through here,
//! on the runtime that hosts the client.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio_util::task::TaskTracker;

use crate::acquire::{self, NotifyOrBackoff, Request};
use crate::backend::{Backend, BackendKind, Mode, Names, Token};
use crate::callers::{self, Routed};
use crate::config::{LockConfig, Settings};
use crate::error::LockError;
use crate::hold::{self, Hold};
use crate::info::{self, LockInfo};
use crate::owner::Identity;
use crate::renew::Renewer;
use crate::signal::Signal;
use crate::wait::WakeRegistry;
use tracing::Instrument as _;

use crate::events::Labels;
use crate::{bridge, events};

pub(crate) struct Engine {
    pub(crate) backend: Arc<Backend>,
    pub(crate) settings: Settings,
    /// Who this client is, recorded in every grant.
    identity: Identity,
    /// Whether locks carry a fencing token unless they say otherwise.
    fencing: bool,
    /// Whether every lock carries one (the backend's token costs nothing).
    fencing_free: bool,
    /// The `backend` label.
    kind: BackendKind,
    pub(crate) runtime: Handle,
    renewer: Renewer,
    wakers: Arc<WakeRegistry>,
    /// Every lock granted and not yet let go, for `shutdown`.
    held: Mutex<HashMap<u64, Arc<Hold>>>,
    /// The acquisitions under way, by number: `shutdown` raises their signals (they stop
    /// waiting, and leave their places in line) and waits for them.
    acquiring: Mutex<HashMap<u64, Arc<Signal>>>,
    /// Numbers [`acquiring`](Self::acquiring)'s entries.
    acquisitions: AtomicU64,
    /// One token per acquisition under way: `shutdown` waits for them.
    acquiring_tasks: TaskTracker,
    /// Releases and cleanups running in the background.
    background: TaskTracker,
    shut_down: AtomicBool,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("backend", &self.backend)
            .field("fencing", &self.fencing)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Validates `config` and builds the engine. Connections are made lazily, on first use.
    pub(crate) fn new(config: LockConfig) -> Result<Arc<Engine>, LockError> {
        let valid = config.validate()?;
        let runtime = match valid.runtime {
            Some(runtime) => runtime,
            None => bridge::library_runtime()?.clone(),
        };
        // The connection managers and the renewal driver spawn onto the current runtime: this one.
        let _entered = runtime.enter();
        let settings = valid.settings;
        let wakers = Arc::new(WakeRegistry::default());
        let kind = valid.backend.kind();
        let backend = Arc::new(valid.backend.build(&settings, Arc::clone(&wakers))?);
        let renewer = Renewer::start(Arc::clone(&backend), settings.clone());
        let identity = Identity::new(settings.owner.as_deref());
        let engine = Arc::new(Engine {
            backend,
            identity,
            settings,
            fencing: valid.fencing,
            fencing_free: valid.fencing_free,
            kind,
            runtime,
            renewer,
            wakers,
            held: Mutex::new(HashMap::new()),
            acquiring: Mutex::new(HashMap::new()),
            acquisitions: AtomicU64::new(0),
            acquiring_tasks: TaskTracker::new(),
            background: TaskTracker::new(),
            shut_down: AtomicBool::new(false),
        });
        #[cfg(feature = "testing")]
        if let Some(faults) = &engine.settings.faults {
            faults.attach(Arc::<Engine>::downgrade(&engine));
        }
        Ok(engine)
    }

    /// Whether every lock carries a fencing token, asked for or not (etcd, in memory).
    pub(crate) fn fencing_free(&self) -> bool {
        self.fencing_free
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Hold>>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This engine's identity, for the reentrancy scope.
    pub(crate) fn id(self: &Arc<Self>) -> usize {
        Arc::as_ptr(self) as usize
    }

    /// Checks a lock's arguments against the config (the same rule for every call) and puts its
    /// keys in canonical order: sorted, without duplicates.
    pub(crate) fn request(
        &self,
        keys: Keys,
        times: Times,
        name: Option<Arc<str>>,
        mode: Mode,
    ) -> Result<Request, LockError> {
        let Times {
            ttl,
            wait,
            max_hold,
            min_hold,
        } = times;
        if self.shut_down.load(Ordering::Acquire) {
            return Err(shut_down());
        }
        if keys.as_slice().is_empty() {
            return Err(LockError::config("keys", "must name at least one key"));
        }
        for key in keys.as_slice() {
            check_name(key)?;
        }
        let ttl = ttl.unwrap_or(self.settings.default_ttl);
        crate::config::check_ttl("ttl", ttl)?;
        let max_hold = max_hold.or(self.settings.default_max_hold);
        if max_hold.is_some_and(|d| d.is_zero()) {
            return Err(LockError::config("max_hold", "must be greater than zero"));
        }
        // Zero asks for nothing (no minimum).
        let min_hold = min_hold.filter(|d| !d.is_zero());
        check_min_hold(min_hold, max_hold, mode)?;
        let wait = wait.unwrap_or(self.settings.default_wait);
        let names: Names = match keys {
            Keys::One(key) => Arc::from([Arc::from(key)]),
            Keys::Many(mut keys) => {
                keys.sort_unstable();
                keys.dedup();
                keys.into_iter().map(Arc::from).collect()
            }
        };
        if mode != Mode::Exclusive {
            if names.len() > 1 {
                return Err(LockError::config(
                    "keys",
                    format!("a {mode} lock takes one key"),
                ));
            }
            self.backend
                .supports(mode)
                .map_err(|reason| LockError::config(mode.argument(), reason))?;
        }
        let labels = Labels {
            lock: name.unwrap_or_else(|| Arc::clone(&UNNAMED)),
            backend: self.kind,
        };
        let asked_at = Instant::now();
        Ok(Request {
            span: events::span(&labels, &names),
            names,
            ttl,
            asked_at,
            give_up: asked_at.checked_add(wait),
            fencing: self.fencing,
            mode,
            max_hold,
            min_hold,
            labels,
        })
    }

    /// Acquires on the hosting runtime. When `caller_gone` is raised, waiting stops; a grant
    /// that nobody takes any more is released by the caller's side (the guard's drop).
    /// `shutdown` raises it too: then the call answers that the client was shut down.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        req: Request,
        caller_gone: Arc<Signal>,
    ) -> Result<Arc<Hold>, LockError> {
        let _under_way = self.acquiring_tasks.token();
        let number = self.acquisitions.fetch_add(1, Ordering::Relaxed);
        self.acquiring().insert(number, Arc::clone(&caller_gone));
        let _registered = Unregister {
            engine: self,
            number,
        };
        if self.shut_down.load(Ordering::Acquire) {
            // Shut down after the request was made, before `shutdown` could see this one.
            caller_gone.raise();
        }
        let mut strategy = NotifyOrBackoff::new(
            &self.backend,
            &self.wakers,
            &req.names,
            req.mode,
            &self.settings,
        );
        let ended = acquire::acquire(
            &self.backend,
            &self.settings,
            &self.identity,
            &req,
            &mut strategy,
            &caller_gone,
        )
        .await;
        drop(strategy);
        if let Some(token) = ended.unsure {
            self.cleanup(Arc::clone(&req.names), token, req.mode, req.ttl);
        }
        match ended.result {
            Ok(granted) => self.hold(req, granted),
            // Stopped by `shutdown`, the caller still waiting.
            Err(LockError::Runtime { .. }) if self.shut_down.load(Ordering::Acquire) => {
                Err(shut_down())
            }
            Err(err) => Err(err),
        }
    }

    fn acquiring(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Signal>>> {
        self.acquiring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Acquires in place, with no runtime hop and no task, when the backend answers at once (in
    /// memory), the lock is free and the renewal driver runs (its runtime, when the caller passed
    /// one in, may have shut down); otherwise gives `req` back for [`acquire`](Self::acquire),
    /// which waits, or reports what is wrong.
    pub(crate) fn acquire_at_once(self: &Arc<Self>, req: Request) -> AtOnce {
        let Some(node) = self.backend.at_once() else {
            return AtOnce::NotNow(req);
        };
        if !self.renewer.is_running() {
            return AtOnce::NotNow(req);
        }
        match acquire::acquire_at_once(node, &self.settings, &self.identity, &req) {
            Some(granted) => AtOnce::Done(self.hold(req, granted)),
            None => AtOnce::NotNow(req),
        }
    }

    /// A grant becomes a hold: tracked for `shutdown`, renewed.
    fn hold(
        self: &Arc<Self>,
        req: Request,
        granted: acquire::Granted,
    ) -> Result<Arc<Hold>, LockError> {
        let hold = Arc::new(Hold::new(req, granted));
        self.held().insert(hold.id, Arc::clone(&hold));
        self.renewer.register(Arc::clone(&hold));
        if self.shut_down.load(Ordering::Acquire) {
            // Shut down while this was in flight: give it back at once.
            self.release_in_background(&hold);
            return Err(shut_down());
        }
        Ok(hold)
    }

    /// Releases `hold` and decides the outcome (see `hold::release`); a release no server
    /// answered goes on in the background (the caller is told `Unavailable` or `Lost` at once).
    pub(crate) async fn release(&self, hold: &Hold) -> Result<(), LockError> {
        self.held().remove(&hold.id);
        let (outcome, unanswered) = hold::release(hold, &self.backend).await;
        if unanswered {
            self.retry_release(hold);
        }
        outcome
    }

    /// Goes on with `hold`'s release, which no server answered, in the background (see
    /// [`cleanup`](Self::cleanup)).
    fn retry_release(&self, hold: &Hold) {
        events::release_retried(hold.name());
        self.cleanup(
            Arc::clone(&hold.names),
            hold.token.clone(),
            hold.mode,
            hold.ttl,
        );
    }

    /// Releases `hold` in place when the backend answers at once (in memory); `None` (and nothing
    /// done) otherwise.
    pub(crate) fn release_at_once(&self, hold: &Hold) -> Option<Result<(), LockError>> {
        let node = self.backend.at_once()?;
        self.held().remove(&hold.id);
        let _in_span = hold.span.enter();
        Some(hold::release_at_once(hold, node))
    }

    /// Releases `hold` from a guard's drop: never blocks; `shutdown` waits for it.
    pub(crate) fn release_in_background(self: &Arc<Self>, hold: &Arc<Hold>) {
        if let Some(released) = self.release_at_once(hold) {
            if let Err(err) = released {
                events::release_failed(hold.name(), &err);
            }
            return;
        }
        let engine = Arc::clone(self);
        let span = hold.span.clone();
        let hold = Arc::clone(hold);
        let release = async move {
            if let Err(err) = engine.release(&hold).await {
                events::release_failed(hold.name(), &err);
            }
        };
        self.background
            .spawn_on(release.instrument(span), &self.runtime);
    }

    /// Releases a token whose acquisition may have succeeded unseen, or whose release no server
    /// answered, retrying until a server answers (for up to a minute, or the TTL when longer).
    /// Its waiters are told, as by a release: a grant nobody uses was a real key all the same,
    /// and the waiters it refused marked the lock and sleep on the strength of its holder's
    /// announcement (a grant given back without a wake-up held them up for their longest
    /// pause). Nobody contends with them for it: the call it stands for is over. An attempt sent
    /// before a freeze or a reset connection can still run when the server resumes; a release answered
    /// after the resume runs after it, so no grant of a failed call outlives the call by more
    /// than that. It goes over the connection the acquisition's requests went over (see
    /// [`callers`]): a release on another connection could overtake a request still on its way.
    fn cleanup(&self, names: Names, token: Token, mode: Mode, ttl: Duration) {
        let backend = Arc::clone(&self.backend);
        let route = callers::current();
        let cleanup = Box::pin(async move {
            let give_up = Instant::now() + ttl.max(Duration::from_secs(60));
            let mut pause = Duration::from_millis(50);
            loop {
                match backend.release(&names, &token, mode, true).await {
                    Ok(_) => return,
                    Err(causes)
                        if Instant::now() < give_up
                            && causes.iter().all(|c| c.kind.is_transient()) =>
                    {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(1));
                    }
                    Err(causes) => {
                        events::cleanup_failed(&names[0], &causes);
                        return;
                    }
                }
            }
        });
        self.background.spawn_on(
            Routed {
                route,
                work: cleanup,
            },
            &self.runtime,
        );
    }

    /// What the servers say of the lock `name` (see [`crate::inspect`]).
    pub(crate) async fn inspect(&self, name: &str) -> Result<Option<LockInfo>, LockError> {
        check_name(name)?;
        info::inspect(&self.backend, name).await
    }

    /// Deletes the lock `name` whoever holds it (see [`crate::force_release`]).
    pub(crate) async fn force_release(&self, name: &str) -> Result<bool, LockError> {
        check_name(name)?;
        let released = info::force_release(&self.backend, name).await;
        events::forced_release(name, &released);
        released
    }

    /// Releases every lock still held (their holders see them lost; one whose `min_hold` has not
    /// passed is left for the rest of it), refuses new ones, stops the acquisitions under way
    /// (their calls answer that the client was shut down, and a waiter leaves its place in a
    /// queue, which would otherwise be handed the lock at the next release and keep it for the
    /// place's lease after the process exited), and waits up to one request timeout for them,
    /// for the acquisitions whose callers went away (a grant that lands is given back) and for
    /// the releases still running. Locks let go before their `min_hold` passed are no longer
    /// held: they are left alone, and expire by themselves.
    pub(crate) async fn shutdown(self: Arc<Self>) {
        self.shut_down.store(true, Ordering::Release);
        let acquiring: Vec<Arc<Signal>> = self.acquiring().drain().map(|(_, s)| s).collect();
        for stop in acquiring {
            stop.raise();
        }
        let held: Vec<Arc<Hold>> = self.held().drain().map(|(_, hold)| hold).collect();
        for hold in held {
            hold.shut_down();
            let engine = Arc::clone(&self);
            self.background.spawn_on(
                async move {
                    let (outcome, unanswered) = hold::release(&hold, &engine.backend).await;
                    // Lost by definition now: only a failure to reach the servers is news.
                    if let Err(err @ LockError::Unavailable { .. }) = outcome {
                        events::release_failed(hold.name(), &err);
                    }
                    // Retried as a guard's release is, for as long as the wait below lasts
                    // (and on, if the runtime outlives it).
                    if unanswered {
                        engine.retry_release(&hold);
                    }
                },
                &self.runtime,
            );
        }
        self.background.close();
        let bound = self
            .settings
            .connect_timeout
            .saturating_add(self.settings.response_timeout);
        let settled = async {
            // First the acquisitions, and the calls whose callers went away: their grants and
            // cleanups start releases.
            self.acquiring_tasks.close();
            self.acquiring_tasks.wait().await;
            bridge::left_behind().await;
            self.background.wait().await;
            self.backend.settled().await;
        };
        let _ = tokio::time::timeout(bound, settled).await;
        self.acquiring_tasks.reopen();
        self.background.reopen();
    }
}

/// A loss injected by [`Faults::lose`](crate::testing::Faults::lose): each hold of the key is
/// declared lost, as the renewal driver declares it when a server says "not yours".
#[cfg(feature = "testing")]
impl crate::testing::Target for Engine {
    fn lose(&self, key: &str) -> bool {
        let holds: Vec<(Arc<Hold>, usize)> = self
            .held()
            .values()
            .filter_map(|hold| {
                let index = hold.names.iter().position(|name| **name == *key)?;
                Some((Arc::clone(hold), index))
            })
            .collect();
        for (hold, index) in &holds {
            hold.declare_lost(*index, "lost by lock_runtime::testing::Faults::lose");
        }
        !holds.is_empty()
    }
}

/// Takes an acquisition off [`Engine::acquiring`] when it ends.
struct Unregister<'a> {
    engine: &'a Engine,
    number: u64,
}

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        self.engine.acquiring().remove(&self.number);
    }
}

/// The label of a lock without a name: one for every such call.
static UNNAMED: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("unnamed"));

/// The keys a lock asks for, as given: a single key needs no list of its own.
pub(crate) enum Keys {
    One(String),
    Many(Vec<String>),
}

impl Keys {
    fn as_slice(&self) -> &[String] {
        match self {
            Keys::One(key) => std::slice::from_ref(key),
            Keys::Many(keys) => keys,
        }
    }
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// The durations a lock asks for: `None` takes the config's default (none for `min_hold`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Times {
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) min_hold: Option<Duration>,
}

/// What [`Engine::acquire_at_once`] did.
pub(crate) enum AtOnce {
    /// Granted (or granted while shutting down: given back, and the error).
    Done(Result<Arc<Hold>, LockError>),
    /// Nothing: the request, for the full path.
    NotNow(Request),
}

fn shut_down() -> LockError {
    LockError::Runtime {
        reason: "lock_runtime::shutdown was called".to_owned(),
    }
}

fn check_name(name: &str) -> Result<(), LockError> {
    if name.is_empty() {
        return Err(LockError::config("key", "must not be empty"));
    }
    Ok(())
}

/// `min_hold` (not zero) keeps an exclusive lock at least that long after its grant; it must fit
/// in `max_hold`, the longest any call may hold the lock.
fn check_min_hold(
    min_hold: Option<Duration>,
    max_hold: Option<Duration>,
    mode: Mode,
) -> Result<(), LockError> {
    let Some(min_hold) = min_hold else {
        return Ok(());
    };
    lock_rules::check_min_hold(min_hold)
        .map_err(|e| LockError::config("min_hold", format!("{e}, got {min_hold:?}")))?;
    if mode != Mode::Exclusive {
        return Err(LockError::config(
            "min_hold",
            format!("applies to exclusive locks, not to a {mode} lock"),
        ));
    }
    if let Some(max_hold) = max_hold.filter(|max| *max < min_hold) {
        return Err(LockError::config(
            "min_hold",
            format!("({min_hold:?}) must not be greater than max_hold ({max_hold:?})"),
        ));
    }
    Ok(())
}
