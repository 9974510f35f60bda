//! Leader election on the lock machinery. An election named `name` is the exclusive,
//! non-reentrant lock `name`: a campaign waits for it as long as it takes, the leader holds it
//! (renewed) until it resigns, loses it or dies, and its fencing token, always on, is the epoch.
//! Who leads is what `inspect(name)` records of the holder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, Stream};

use crate::bridge;
use crate::engine::Engine;
use crate::error::LockError;
use crate::global;
use crate::guard::LockGuard;
use crate::lock::Lock;
use crate::owner::Owner;

/// The label of every election's lock in tracing spans and metrics (bounded, unlike names).
const LABEL: &str = "election";

/// A leader election: of all the campaigners on one name, across every process that shares the
/// backend, one leads at a time.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::Election;
///
/// let leadership = Election::new("scheduler").campaign().await?; // waits until elected
/// let epoch = leadership.epoch(); // hand it to what the leader writes to
/// tokio::select! {
///     () = leadership.lost() => eprintln!("no longer the leader (epoch {epoch})"),
///     () = async { /* the leader's work */ } => leadership.resign().await?,
/// }
/// # Ok(()) }
/// ```
///
/// The election `name` is the lock `name` (the configured key prefix applies as for any lock):
/// [`inspect`](crate::inspect)`(name)` and `lockctl inspect name` show it, and
/// [`force_release`](crate::force_release)`(name)` deposes the leader. It is taken with
/// [`Lock`]'s machinery: exclusive, not reentrant, waited for as long as it takes, renewed while
/// held (every third of the ttl), and always with a fencing token, also under Redlock where
/// fencing is otherwise off. Do not lock the same name with [`Lock`] as well: that holder would
/// count as a leader without an epoch.
#[derive(Clone)]
pub struct Election {
    engine: Option<Arc<Engine>>,
    name: String,
    ttl: Option<Duration>,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Election {
    /// The election `name` through the global client set up by [`init`](crate::init).
    pub fn new(name: impl Into<String>) -> Self {
        Election {
            engine: None,
            name: name.into(),
            ttl: None,
        }
    }

    pub(crate) fn on(mut self, engine: Arc<Engine>) -> Self {
        self.engine = Some(engine);
        self
    }

    /// The leader's time to live (default: the config's ttl, as for [`Lock::ttl`]). The leader
    /// renews it every third; it bounds how long a crashed leader keeps the others waiting, and
    /// sets how often [`observe`](Self::observe) looks.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The election's name: the lock's key.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits until this campaigner is elected, as long as that takes, and returns the
    /// leadership. Dropping the future stops the campaign and leaves nothing behind (a grant
    /// made meanwhile is released). Infrastructure failures are never "not elected": failures
    /// that may pass (timeouts, refused connections, a busy server) are retried while the
    /// campaign waits, and the others (credentials, permissions) end it with
    /// [`LockError::Unavailable`].
    pub async fn campaign(&self) -> Result<Leadership, LockError> {
        let guard = self.lock().acquire().await?;
        match guard.fencing_token() {
            Some(epoch) => Ok(Leadership { guard, epoch }),
            // Every backend fences a request that asks for it; dropping the guard releases.
            None => Err(LockError::Runtime {
                reason: format!("the grant of election {} carried no epoch", self.name),
            }),
        }
    }

    /// Who leads now, as the servers recorded its grant (see [`LockInfo::owners`]); `None` when
    /// nobody does. The answer can be stale by the time it arrives. A server failure is an error
    /// ([`LockError::Unavailable`]), never `None`.
    ///
    /// [`LockInfo::owners`]: crate::LockInfo::owners
    pub async fn leader(&self) -> Result<Option<Owner>, LockError> {
        look(self.engine()?, self.name.clone(), Duration::ZERO).await
    }

    /// The leader now, then each change: a different owner, or none. Owners of two grants
    /// differ (each records when it asked), so a re-election of the same process is a change.
    ///
    /// It looks with [`leader`](Self::leader) at once and then once every renewal period of
    /// this election's ttl (a third of it, or [`LockConfig::renew_interval`]), so a change is
    /// seen within one renewal period and one request; a leadership shorter than that may go
    /// unseen. A failed look yields the error, and the next look yields the leader again even
    /// if unchanged. After [`LockError::Unavailable`] it goes on looking; any other error (a bad
    /// name or ttl, [`LockError::NotInitialized`]) ends the stream. Each look runs on the
    /// runtime that hosts the client, so the stream can be polled from any executor.
    ///
    /// [`LockConfig::renew_interval`]: crate::LockConfig::renew_interval
    pub fn observe(&self) -> impl Stream<Item = Result<Option<Owner>, LockError>> + Send + 'static {
        let start = Observer {
            election: self.clone(),
            last: None,
            delay: Duration::ZERO,
            ended: false,
        };
        stream::unfold(start, |mut observer| async move {
            let item = observer.next_change().await?;
            Some((item, observer))
        })
    }

    fn engine(&self) -> Result<Arc<Engine>, LockError> {
        match &self.engine {
            Some(engine) => Ok(Arc::clone(engine)),
            None => global::engine().map(Arc::clone),
        }
    }

    fn lock(&self) -> Lock {
        let lock = Lock::new(self.name.clone())
            .wait(Duration::MAX)
            .reentrant(false)
            .name(LABEL)
            .fencing(true);
        let lock = match self.ttl {
            Some(ttl) => lock.ttl(ttl),
            None => lock,
        };
        match &self.engine {
            Some(engine) => lock.on(Arc::clone(engine)),
            None => lock,
        }
    }
}

/// The state of an [`Election::observe`] stream.
struct Observer {
    election: Election,
    /// What was yielded last (`None`: nothing yet, or an error since).
    last: Option<Option<Owner>>,
    /// How long to wait before the next look.
    delay: Duration,
    ended: bool,
}

impl Observer {
    /// Looks until the leader differs from the last one yielded; `None` once the stream ended.
    async fn next_change(&mut self) -> Option<Result<Option<Owner>, LockError>> {
        if self.ended {
            return None;
        }
        loop {
            let looked = self.look().await;
            match looked {
                Ok(now) if self.last.as_ref() == Some(&now) => {}
                Ok(now) => {
                    self.last = Some(now.clone());
                    return Some(Ok(now));
                }
                Err(err) => {
                    self.last = None;
                    self.ended = !matches!(err, LockError::Unavailable { .. });
                    return Some(Err(err));
                }
            }
        }
    }

    /// One look after the pause due, and the pause before the next.
    async fn look(&mut self) -> Result<Option<Owner>, LockError> {
        let engine = self.election.engine()?;
        let ttl = self.election.ttl.unwrap_or(engine.settings.default_ttl);
        crate::config::check_ttl("ttl", ttl)?;
        let delay = std::mem::replace(&mut self.delay, engine.settings.renew_every(ttl));
        look(engine, self.election.name.clone(), delay).await
    }
}

/// Waits `delay`, then asks who holds `name`: on the runtime that hosts the client.
async fn look(
    engine: Arc<Engine>,
    name: String,
    delay: Duration,
) -> Result<Option<Owner>, LockError> {
    let runtime = engine.runtime.clone();
    bridge::run(&runtime, move |gone| async move {
        if !delay.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                // Nobody takes the answer any more.
                () = gone.raised() => return Ok(None),
            }
        }
        let info = engine.inspect(&name).await?;
        Ok(info.and_then(|info| info.owners.into_iter().next()))
    })
    .await?
}

/// The leadership won by [`Election::campaign`]: the election's lock, held and renewed until
/// [`resign`](Self::resign)ed, lost, or dropped (dropping releases it as dropping a
/// [`LockGuard`] does, in the background; [`shutdown`](crate::shutdown) waits for it).
/// `Debug` shows the name, the epoch and whether it was lost, never the lock's token.
#[must_use = "leadership is given up when it is dropped"]
pub struct Leadership {
    guard: LockGuard,
    epoch: u64,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("name", &self.guard.key())
            .field("epoch", &self.epoch)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl Leadership {
    /// The election's name.
    pub fn name(&self) -> &str {
        self.guard.key()
    }

    /// This leadership's epoch: the grant's fencing token, larger than every earlier leader's
    /// on every backend (as [`LockGuard::fencing_token`] grows). Send it with what the leader
    /// writes, so that a resource can refuse a deposed leader that still writes.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// True once the leadership was lost: its renewal was refused (say the key was
    /// force-released), or its validity ran out before a renewal was confirmed. It stays lost.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Resolves when the leadership is lost (never, if it is resigned first): stop leading then.
    /// It is noticed at the next renewal (every third of the ttl) or at the validity deadline.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + '_ {
        self.guard.lost()
    }

    /// Gives the leadership up: releases the election's lock, and a campaigner waiting for it
    /// is woken. [`LockError::Lost`] when it had been lost; [`LockError::Unavailable`] when the
    /// servers could not be reached (the release is retried in the background; the lock expires by
    /// its ttl at the latest).
    pub async fn resign(self) -> Result<(), LockError> {
        self.guard.release().await
    }
}
