//! Renewals on one Redis master: one pipeline of extension scripts per chunk of holds, with the
//! `WAIT` of `min_replicas` behind it.

use redis::RedisResult;
use redis::aio::ConnectionLike;

use super::{Calls, Conn};
use crate::backend::redis::keys::KeyKind;
use crate::backend::scripts;
use crate::backend::{ExtendItem, ExtendOutcome, Mode, millis};
use crate::error::NodeFailure;

/// How many extensions go into one pipeline (one round trip).
const EXTEND_CHUNK: usize = 512;

impl Calls {
    pub(crate) async fn extend_chunk<C: Conn>(
        &self,
        conn: &C,
        chunk: &[ExtendItem<'_>],
    ) -> Vec<ExtendOutcome> {
        // With `min_replicas` the pipeline ends in `WAIT`: on a connection of its own.
        let Some(pool) = self.replicas.and(self.waits.as_ref()) else {
            return self.extend_chunk_on(&mut conn.clone(), chunk).await.0;
        };
        let mut own = match self.bounded("connect", pool.take()).await {
            Ok(own) => own,
            Err(failure) => return ExtendOutcome::all_failed(chunk.len(), &failure),
        };
        let (outcomes, answered) = self.extend_chunk_on(&mut own, chunk).await;
        if answered {
            pool.give_back(own);
        }
        outcomes
    }

    /// Extends `chunk` in one pipeline on `conn`, and says whether the server answered.
    async fn extend_chunk_on<D: ConnectionLike + Send>(
        &self,
        conn: &mut D,
        chunk: &[ExtendItem<'_>],
    ) -> (Vec<ExtendOutcome>, bool) {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for item in chunk {
            let mut invocation = match item.mode {
                Mode::Exclusive | Mode::Fair => scripts::EXTEND.prepare_invoke(),
                Mode::Shared | Mode::Permits(_) => scripts::SHARED_EXTEND.prepare_invoke(),
            };
            for name in item.names {
                invocation.key(self.lock_keys(name).of(KeyKind::Lock));
            }
            invocation.arg(item.token.as_str()).arg(millis(item.ttl));
            pipe.invoke_script(&invocation);
        }
        if let Some(replicas) = self.replicas {
            pipe.cmd("WAIT")
                .arg(replicas.count)
                .arg(millis(replicas.timeout));
        }
        let mut replies = self
            .bounded(
                "extend",
                pipe.query_async::<Vec<RedisResult<i64>>>(&mut *conn),
            )
            .await;
        let lost_scripts = |r: &Result<Vec<RedisResult<i64>>, NodeFailure>| {
            r.as_ref().is_ok_and(|items| {
                items.iter().any(|i| {
                    i.as_ref().is_err_and(|e| {
                        e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                    })
                })
            })
        };
        if lost_scripts(&replies) {
            // The server lost its script cache (restart, SCRIPT FLUSH): load once and resend.
            let load = async {
                scripts::EXTEND.load_async(&mut *conn).await?;
                scripts::SHARED_EXTEND.load_async(&mut *conn).await
            };
            replies = match self.bounded("script load", load).await {
                Ok(_) => self.bounded("extend", pipe.query_async(&mut *conn)).await,
                Err(failure) => Err(failure),
            };
        }
        // With `min_replicas`, the last reply is WAIT's count: too few acknowledgements turn
        // every extension of the chunk into a failed (retried) one.
        let short = match (&mut replies, self.replicas) {
            (Ok(items), Some(replicas)) if items.len() == chunk.len() + 1 => match items.pop() {
                Some(Ok(acks)) if acks >= i64::from(replicas.count) => None,
                Some(Ok(acks)) => {
                    Some(self.too_few_replicas("renewal", u32::try_from(acks).unwrap_or(0)))
                }
                Some(Err(err)) => Some(NodeFailure::from_redis(&self.addr, &err)),
                None => None,
            },
            _ => None,
        };
        let outcomes = match replies {
            Ok(items) if items.len() == chunk.len() => items
                .into_iter()
                .map(|reply| match reply {
                    Ok(1) => match &short {
                        Some(failure) => ExtendOutcome::Failed(failure.clone()),
                        None => ExtendOutcome::Extended,
                    },
                    Ok(n) => ExtendOutcome::NotOwned {
                        index: usize::try_from(-n - 1).unwrap_or(0),
                    },
                    Err(err) => ExtendOutcome::Failed(NodeFailure::from_redis(&self.addr, &err)),
                })
                .collect(),
            Ok(_) => {
                let failure = NodeFailure::response(&self.addr, "extend: wrong number of replies");
                return (ExtendOutcome::all_failed(chunk.len(), &failure), false);
            }
            Err(failure) => return (ExtendOutcome::all_failed(chunk.len(), &failure), false),
        };
        (outcomes, true)
    }

    pub(crate) async fn extend_many<C: Conn>(
        &self,
        conn: &C,
        items: &[ExtendItem<'_>],
    ) -> Vec<ExtendOutcome> {
        let mut out = Vec::with_capacity(items.len());
        for chunk in items.chunks(EXTEND_CHUNK) {
            out.extend(self.extend_chunk(conn, chunk).await);
        }
        out
    }
}
