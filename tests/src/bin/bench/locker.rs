//! What a measured pair is: one acquire + release of an uncontended lock, by this crate or by the
//! hand-written `redis` loop it is compared with (one connection, or fanned out to a quorum).

use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use lock_runtime::LockClient;
use redis::AsyncCommands as _;
use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::{ExistenceCheck, Script, SetExpiry, SetOptions};

use crate::sections::multi::TwoKeys;
use crate::{Res, TTL};

const TTL_MS: u64 = 10_000;

/// The floor's release: compare-and-delete.
pub(crate) const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// One implementation of "acquire then release an uncontended lock".
#[derive(Clone)]
pub(crate) enum Locker {
    Crate(LockClient),
    /// Two keys derived from the task's key (section 5).
    Two(LockClient, TwoKeys),
    Multiplexed(MultiplexedConnection, Arc<Script>),
    Manager(ConnectionManager, Arc<Script>),
    /// The raw loop fanned out to independent nodes: done once a majority answered each step.
    Quorum(Vec<MultiplexedConnection>, Arc<Script>),
}

impl Locker {
    /// Whether this locker makes its own tokens (the crate does; the hand-written loops take the
    /// one they are given).
    pub(crate) fn makes_tokens(&self) -> bool {
        matches!(self, Locker::Crate(_) | Locker::Two(..))
    }

    pub(crate) async fn pair(&mut self, key: &str, token: &str) -> Res<()> {
        match self {
            Locker::Crate(client) => {
                let guard = client.lock(key).ttl(TTL).acquire().await?;
                guard.release().await?;
                Ok(())
            }
            Locker::Two(client, shape) => shape.pair(client, key).await,
            Locker::Multiplexed(conn, script) => raw_pair(conn, script, key, token).await,
            Locker::Manager(conn, script) => raw_pair(conn, script, key, token).await,
            Locker::Quorum(conns, script) => {
                let need = conns.len() / 2 + 1;
                let acquires = conns.iter().map(|conn| {
                    let mut conn = conn.clone();
                    async move { raw_set(&mut conn, key, token).await }
                });
                first_n(acquires.collect(), need).await?;
                let script: &Script = script;
                let releases = conns.iter().map(|conn| {
                    let mut conn = conn.clone();
                    async move { raw_release(&mut conn, script, key, token).await }
                });
                first_n(releases.collect(), need).await
            }
        }
    }
}

async fn raw_pair<C>(conn: &mut C, release: &Script, key: &str, token: &str) -> Res<()>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    raw_set(conn, key, token).await?;
    raw_release(conn, release, key, token).await
}

/// `SET key token NX PX 10000`.
async fn raw_set<C>(conn: &mut C, key: &str, token: &str) -> Res<()>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    let options = SetOptions::default()
        .conditional_set(ExistenceCheck::NX)
        .with_expiration(SetExpiry::PX(TTL_MS));
    let set: Option<String> = conn.set_options(key, token, options).await?;
    if set.is_none() {
        return Err(format!("raw: {key} unexpectedly held").into());
    }
    Ok(())
}

/// EVALSHA of the compare-and-delete script.
async fn raw_release<C>(conn: &mut C, release: &Script, key: &str, token: &str) -> Res<()>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    let deleted: i64 = release.key(key).arg(token).invoke_async(conn).await?;
    if deleted != 1 {
        return Err(format!("raw: {key} was not ours at release").into());
    }
    Ok(())
}

/// Resolves once `need` of `futures` succeeded (dropping the rest), or fails when that became
/// impossible. A minimal `FuturesUnordered` with early exit, enough for five nodes.
async fn first_n<F>(futures: Vec<F>, need: usize) -> Res<()>
where
    F: Future<Output = Res<()>>,
{
    let mut pending: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let (mut ok, mut failed) = (0, 0);
    let total = pending.len();
    std::future::poll_fn(|cx| {
        for slot in &mut pending {
            let Some(future) = slot else { continue };
            if let Poll::Ready(result) = future.as_mut().poll(cx) {
                *slot = None;
                match result {
                    Ok(()) => ok += 1,
                    Err(_) => failed += 1,
                }
            }
        }
        if ok >= need {
            Poll::Ready(Ok(()))
        } else if total - failed < need {
            Poll::Ready(Err("raw: no quorum".into()))
        } else {
            Poll::Pending
        }
    })
    .await
}
