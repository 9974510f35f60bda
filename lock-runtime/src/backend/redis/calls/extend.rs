//! Renewals on one Redis master: one pipeline of extension scripts per chunk of holds, with the
//! `WAIT` of `min_replicas` behind it.

use redis::aio::ConnectionLike;
use redis::{RedisResult, Value};

use super::{Calls, Conn};
use crate::backend::redis::keys::KeyKind;
use crate::backend::redis::native::{Known, NativeCommands, Refusal, refusal};
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
        // A plain lock of one key renews with `SET key token IFEQ token PX ttl` where the server
        // has it: no script.
        let set_ifeq = self
            .native
            .as_ref()
            .and_then(Known::get)
            .is_some_and(NativeCommands::renew);
        let native = |item: &ExtendItem<'_>| {
            set_ifeq && matches!(item.mode, Mode::Exclusive | Mode::Fair) && item.names.len() == 1
        };
        let script = |item: &ExtendItem<'_>| match item.mode {
            Mode::Exclusive | Mode::Fair => &*scripts::EXTEND,
            Mode::Shared | Mode::Permits(_) => &*scripts::SHARED_EXTEND,
        };
        // The scripts this server has not answered since its last failure are loaded in the same
        // write: a client's first renewal (or the first after a restart) then costs one round
        // trip, not three (`NOSCRIPT`, the load, the call again), which on a slow link can take
        // longer than the lock has left.
        let used = chunk
            .iter()
            .filter(|item| !native(item))
            .fold(0, |bits, item| bits | scripts::let_go_bit(script(item)));
        let load = self.unloaded(used);
        for extension in [&*scripts::EXTEND, &*scripts::SHARED_EXTEND] {
            if load & scripts::let_go_bit(extension) != 0 {
                pipe.load_script(extension).ignore();
            }
        }
        for item in chunk {
            if native(item) {
                let token = item.token.as_str();
                pipe.cmd("SET")
                    .arg(self.lock_keys(&item.names[0]).of(KeyKind::Lock))
                    .arg(token)
                    .arg("IFEQ")
                    .arg(token)
                    .arg("PX")
                    .arg(millis(item.ttl));
                continue;
            }
            let mut invocation = script(item).prepare_invoke();
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
                pipe.query_async::<Vec<RedisResult<Value>>>(&mut *conn),
            )
            .await;
        let lost_scripts = |r: &Result<Vec<RedisResult<Value>>, NodeFailure>| {
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
        self.note_loaded(used, replies.as_ref().map(drop));
        // With `min_replicas`, the last reply is WAIT's count: too few acknowledgements turn
        // every extension of the chunk into a failed (retried) one.
        let short = match (&mut replies, self.replicas) {
            (Ok(items), Some(replicas)) if items.len() == chunk.len() + 1 => match items.pop() {
                Some(Ok(Value::Int(acks))) if acks >= i64::from(replicas.count) => None,
                Some(Ok(Value::Int(acks))) => {
                    Some(self.too_few_replicas("renewal", u32::try_from(acks).unwrap_or(0)))
                }
                Some(Ok(_)) => Some(NodeFailure::response(&self.addr, "WAIT: unexpected reply")),
                Some(Err(err)) => Some(NodeFailure::from_redis(&self.addr, &err)),
                None => None,
            },
            _ => None,
        };
        let outcomes = match replies {
            Ok(items) if items.len() == chunk.len() => items
                .into_iter()
                .zip(chunk)
                .map(|(reply, item)| {
                    let reply = if native(item) {
                        self.native_renewal(reply)
                    } else {
                        reply
                    };
                    match reply {
                        Ok(Value::Int(1)) => match &short {
                            Some(failure) => ExtendOutcome::Failed(failure.clone()),
                            None => ExtendOutcome::Extended,
                        },
                        Ok(Value::Int(n)) => ExtendOutcome::NotOwned {
                            index: usize::try_from(-n - 1).unwrap_or(0),
                        },
                        Ok(_) => ExtendOutcome::Failed(NodeFailure::response(
                            &self.addr,
                            "extend: unexpected reply",
                        )),
                        Err(err) => {
                            ExtendOutcome::Failed(NodeFailure::from_redis(&self.addr, &err))
                        }
                    }
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

    /// A native renewal's reply as the script's: `OK` renewed (1), nil not ours (-1), and a key
    /// that is not a string not ours either. A server that refuses `SET .. IFEQ` renews by
    /// script from the next round on (this one counts as failed, and is retried).
    fn native_renewal(&self, reply: RedisResult<Value>) -> RedisResult<Value> {
        match reply {
            Ok(Value::Okay) => Ok(Value::Int(1)),
            Ok(Value::Nil) => Ok(Value::Int(-1)),
            Err(err) => {
                let kind = NodeFailure::from_redis(&self.addr, &err).kind;
                match refusal(kind, err.code()) {
                    Refusal::NotAString => Ok(Value::Int(-1)),
                    Refusal::Refused => {
                        if let Some(known) = &self.native {
                            known.refused_renewal();
                        }
                        tracing::debug!(
                            server = %self.addr,
                            "the server refused SET .. IFEQ: renewing by script"
                        );
                        Err(err)
                    }
                    Refusal::Failed => Err(err),
                }
            }
            other => other,
        }
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
