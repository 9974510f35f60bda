use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::Mode;
use crate::bridge;
use crate::engine::{AtOnce, Engine, Keys, Times};
use tracing::Instrument as _;

use crate::error::LockError;
use crate::global;
use crate::guard::LockGuard;
use crate::hold::{self, Body};
use crate::scope::{self, Held};

/// A lock to acquire: the programmatic form of `#[distributed_lock]`.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// use lock_runtime::Lock;
///
/// let guard = Lock::new("report:2026-11-29")
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(2))
///     .acquire()
///     .await?;
/// // ... critical section; `guard.fencing_token()` for the resource ...
/// guard.release().await?;
///
/// // Or let the lock run the body: released at the end, cancelled on loss or max_hold, and a
/// // success never survives a loss.
/// let moved = Lock::many(["wallet:1", "wallet:2"])
///     .wait(Duration::from_secs(5))
///     .run(async { Ok::<_, lock_runtime::LockError>(30) })
///     .await?;
/// # Ok(()) }
/// ```
#[must_use = "a Lock does nothing until acquired"]
pub struct Lock {
    engine: Option<Arc<Engine>>,
    keys: Keys,
    ttl: Option<Duration>,
    wait: Option<Duration>,
    max_hold: Option<Duration>,
    min_hold: Option<Duration>,
    reentrant: bool,
    fair: bool,
    shared: bool,
    permits: Option<u32>,
    name: Option<Arc<str>>,
    /// Whether to hand out a fencing token, over the config's default ([`Lock::fencing`]).
    fencing: Option<bool>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("keys", &self.keys)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("max_hold", &self.max_hold)
            .field("min_hold", &self.min_hold)
            .field("reentrant", &self.reentrant)
            .field("fair", &self.fair)
            .field("shared", &self.shared)
            .field("permits", &self.permits)
            .field("name", &self.name)
            .field("fencing", &self.fencing)
            .finish_non_exhaustive()
    }
}

impl Lock {
    /// A lock on `key` through the global client set up by [`init`](crate::init).
    pub fn new(key: impl Into<String>) -> Self {
        Lock::with_keys(Keys::One(key.into()))
    }

    /// One lock over several keys through the global client: taken all or nothing, in one
    /// canonical order (sorted, duplicates merged), so `[a, b]` and `[b, a]` never deadlock;
    /// lost when any key is lost. On one Redis node all keys are taken in one atomic script call.
    pub fn many<I>(keys: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        Lock::with_keys(Keys::Many(keys.into_iter().map(Into::into).collect()))
    }

    fn with_keys(keys: Keys) -> Self {
        Lock {
            engine: None,
            keys,
            ttl: None,
            wait: None,
            max_hold: None,
            min_hold: None,
            reentrant: true,
            fair: false,
            shared: false,
            permits: None,
            name: None,
            fencing: None,
        }
    }

    pub(crate) fn on(mut self, engine: Arc<Engine>) -> Self {
        self.engine = Some(engine);
        self
    }

    /// Whether the guard carries a fencing token ([`LockGuard::fencing_token`]): a number that
    /// grows with every grant of the key, for a resource that checks it ([`crate::fence`]).
    /// Default: the config's ([`LockConfig::fencing`](crate::LockConfig::fencing), off unless
    /// set). On Redis a token costs its grant a counter (two commands more in the acquire's one
    /// call); etcd's revision and the in-memory counter cost nothing and are always handed out.
    /// The attribute's `fencing = true` is this.
    pub fn fencing(mut self, enabled: bool) -> Self {
        self.fencing = Some(enabled);
        self
    }

    /// Time to live (default from the config, 30s). Renewed automatically while the guard lives;
    /// it bounds how long a crashed holder keeps others out.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long to wait while someone else holds it (default from the config, 0: one attempt;
    /// `Duration::MAX`: as long as it takes).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The longest the lock may be held (default from the config: no limit). Past it renewal
    /// stops; a body run by [`run`](Self::run) or the attribute is cancelled (async) or has its
    /// result replaced (sync) by [`LockError::MaxHoldExceeded`]; a guard held by hand is released
    /// by its holder, or expires by its TTL.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// The least time the lock is kept after its grant (default: none; ShedLock's
    /// `lockAtLeastFor`): a holder that lets go earlier (a body that returns, a guard released
    /// or dropped) does not delete the keys but leaves them to expire when `min_hold` has passed,
    /// so a scheduled job that finished in 200 ms on one instance does not run again on another
    /// whose timer fires 300 ms later. The caller is not blocked: the release returns as soon as
    /// the server answered it, and nothing is renewed after it; the keys are extended when
    /// `min_hold` is longer than the `ttl`. Other callers meanwhile get
    /// [`LockError::Contended`] (or wait, with [`wait`](Self::wait), until the keys expire).
    /// Let go after `min_hold` passed, the keys are deleted as usual. A lock lost stays
    /// [`LockError::Lost`], and [`shutdown`](crate::shutdown) leaves such keys for the rest of
    /// their `min_hold`.
    ///
    /// Exclusive locks only (one key or several): with [`fair`](Self::fair),
    /// [`shared`](Self::shared) or [`permits`](Self::permits) it is a [`LockError::Config`] error
    /// naming `min_hold`, as is a `min_hold` longer than [`max_hold`](Self::max_hold). Zero asks
    /// for nothing. A nested call that joins an enclosing hold (see
    /// [`reentrant`](Self::reentrant)) keeps that hold's `min_hold`. On etcd the keys may live
    /// up to a second past it (leases count whole seconds).
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.min_hold = Some(min_hold);
        self
    }

    /// Whether a call made while the same task (inside [`run`](Self::run) or a locked async
    /// body) or thread (inside [`run_blocking`](Self::run_blocking) or a locked sync body)
    /// already holds these keys joins that hold (default: true): no round trip, no waiting, and
    /// the lock is released when the outermost holder ends. A call on more keys than are held
    /// is a [`LockError::Config`] error (taking the rest would not be atomic). With `false` a
    /// nested call is like any other caller: it waits for the outer one, which cannot end
    /// meanwhile, so it ends in `Contended` once `wait` runs out.
    pub fn reentrant(mut self, reentrant: bool) -> Self {
        self.reentrant = reentrant;
        self
    }

    /// Whether waiters are granted the lock in the order they arrived (default: false, where a
    /// release wakes every waiter and the quickest wins, newcomers included: a caller that takes
    /// the lock again right after its release keeps it at the rate of its loop). Even then a
    /// wait stays bounded on one Redis node, Sentinel and Cluster: a waiter of one key that has
    /// waited 10 ms takes a place in the key's queue, as a fair waiter does, and the next
    /// release hands it the lock. A fair waiter holds a place in the
    /// key's queue, renewed by its attempts while it waits: one that crashes leaves the queue
    /// within its `ttl`, one that gives up or is cancelled leaves at once. A release hands the
    /// lock to the first waiter on the server and wakes that waiter alone. One key; every caller
    /// of the key should be fair (an unfair caller can take a free lock ahead of the queue).
    /// On every backend; under Redlock the order is the line at the lock's gate node (see the
    /// crate docs).
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Whether this is a shared (read) lock (default: false). Any number of shared holders hold
    /// the key together; an exclusive (default) holder of the same key excludes them all, and
    /// is not starved: while it waits, no new shared holder gets in. Each shared holder has its
    /// own lease, renewed and lost on its own. One key.
    pub fn shared(mut self, shared: bool) -> Self {
        self.shared = shared;
        self
    }

    /// Makes this a semaphore: up to `permits` holders of the key at once, each with its own
    /// renewed lease (a crashed holder's permit comes back within its `ttl`). Every caller of
    /// the key must ask for the same number: a different one is a [`LockError::Config`] error
    /// naming `permits`. One key. Not on Redlock: see the crate docs.
    pub fn permits(mut self, permits: u32) -> Self {
        self.permits = Some(permits);
        self
    }

    /// The label of this lock in its tracing span (`lock`) and metrics (default `unnamed`; the
    /// attribute uses its key templates). Give locks of one kind one name (`"wallet"`), never the
    /// rendered key: metrics keep one series per name.
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    fn engine(&self) -> Result<Arc<Engine>, LockError> {
        match &self.engine {
            Some(engine) => Ok(Arc::clone(engine)),
            None => global::engine().map(Arc::clone),
        }
    }

    /// The kind of hold asked for, from `fair`, `shared` and `permits`.
    fn mode(&self) -> Result<Mode, LockError> {
        Mode::from_flags(self.fair, self.shared, self.permits)
            .map_err(|err| LockError::config(err.argument(), err.to_string()))
    }

    /// Asks for `mode` (the macro's call carries the mode its arguments make).
    pub(crate) fn with_mode(mut self, mode: Mode) -> Self {
        (self.fair, self.shared, self.permits) = match mode {
            Mode::Exclusive => (false, false, None),
            Mode::Fair => (true, false, None),
            Mode::Shared => (false, true, None),
            Mode::Permits(n) => (false, false, Some(n)),
        };
        self
    }

    /// The engine and the request, or a guard already: one that joins a hold of the current
    /// scope, or one granted in place (in memory, when the lock is free).
    fn prepare(self) -> Result<Prepared, LockError> {
        let engine = self.engine()?;
        let mode = self.mode()?;
        let mut req = engine.request(
            self.keys,
            Times {
                ttl: self.ttl,
                wait: self.wait,
                max_hold: self.max_hold,
                min_hold: self.min_hold,
            },
            self.name,
            mode,
        )?;
        if let Some(fencing) = self.fencing {
            req.fencing = fencing || engine.fencing_free();
        }
        if self.reentrant {
            match scope::find(engine.id(), &req.names) {
                Held::Nothing => {}
                Held::All(hold) if !joinable(hold.mode, mode) => {
                    return Err(LockError::config(
                        "reentrant",
                        format!(
                            "this task or thread holds the key as a {} lock; a nested {mode} lock \
                             on it would wait on itself",
                            hold.mode
                        ),
                    ));
                }
                Held::All(hold) => return LockGuard::joined(engine, hold).map(Prepared::Ready),
                Held::Some => {
                    return Err(LockError::config(
                        "keys",
                        "asks for more keys than the enclosing lock holds; taking the rest would \
                         not be atomic: lock them all in the outer call",
                    ));
                }
            }
        }
        match engine.acquire_at_once(req) {
            AtOnce::Done(hold) => hold.map(|hold| Prepared::Ready(LockGuard::new(engine, hold))),
            AtOnce::NotNow(req) => Ok(Prepared::Acquire(engine, req)),
        }
    }

    /// Acquires the lock, waiting up to `wait`. Works from any async runtime (the work runs on the
    /// runtime that hosts the client). Dropping the future stops waiting and releases anything
    /// granted meanwhile.
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let (engine, req) = match self.prepare()? {
            Prepared::Ready(guard) => return Ok(guard),
            Prepared::Acquire(engine, req) => (engine, req),
        };
        let runtime = engine.runtime.clone();
        let span = req.span.clone();
        bridge::run(&runtime, move |gone| {
            async move {
                let hold = engine.acquire(req, gone).await?;
                Ok(LockGuard::new(engine, hold))
            }
            .instrument(span)
        })
        .await?
    }

    /// Acquires the lock from sync code, blocking this thread up to `wait` plus one request
    /// timeout. Safe inside an async runtime too (it blocks that thread, it never panics); on a
    /// current-thread runtime that must also run the holder, it would wait for the full `wait`.
    pub fn acquire_blocking(self) -> Result<LockGuard, LockError> {
        let (engine, req) = match self.prepare()? {
            Prepared::Ready(guard) => return Ok(guard),
            Prepared::Acquire(engine, req) => (engine, req),
        };
        let runtime = engine.runtime.clone();
        let span = req.span.clone();
        let work = async move {
            let hold = engine.acquire(req, Arc::default()).await?;
            Ok(LockGuard::new(engine, hold))
        };
        bridge::run_blocking(&runtime, work.instrument(span))?
    }

    /// Acquires the lock, runs `body` while holding it (renewed; cancelled at its next `.await`
    /// if the lock is lost or `max_hold` passes), releases it, and returns the body's result:
    /// what the attribute does. A success never survives a loss (`Err(Lost)`) or a passed
    /// `max_hold` (`Err(MaxHoldExceeded)`); the body's own error is kept. Nested locks inside
    /// `body` on the same keys join this one (see [`reentrant`](Self::reentrant)).
    pub async fn run<T, E, F>(self, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<LockError>,
    {
        let guard = self.acquire().await?;
        let out = guard.until_stopped(body).await;
        let verdict = guard.finish(Body::of(out.as_ref(), Result::is_ok)).await;
        hold::call_result(verdict, out).unwrap_or_else(|err| Err(err.into()))
    }

    /// [`run`](Self::run) for sync code: blocks this thread to acquire, runs `body` on it, then
    /// releases. A sync body cannot be interrupted: on loss or a passed `max_hold` it runs to its
    /// end and its success is replaced by the error.
    pub fn run_blocking<T, E>(self, body: impl FnOnce() -> Result<T, E>) -> Result<T, E>
    where
        E: From<LockError>,
    {
        let guard = self.acquire_blocking()?;
        let out = guard.in_scope_blocking(body);
        let verdict = guard.finish_blocking(Body::of(Some(&out), Result::is_ok));
        hold::call_result(verdict, Some(out)).unwrap_or_else(|err| Err(err.into()))
    }
}

/// Whether a nested lock of mode `inner` may join a hold of mode `outer`: an exclusive hold
/// covers any exclusive or shared use; a shared or permit hold only its own kind.
fn joinable(outer: Mode, inner: Mode) -> bool {
    let exclusive = |m| matches!(m, Mode::Exclusive | Mode::Fair);
    outer == inner || (exclusive(outer) && (exclusive(inner) || inner == Mode::Shared))
}

enum Prepared {
    /// A guard: the current task or thread holds the keys already, or the lock was granted in
    /// place.
    Ready(LockGuard),
    /// To acquire: the full path, which waits.
    Acquire(Arc<Engine>, crate::acquire::Request),
}
