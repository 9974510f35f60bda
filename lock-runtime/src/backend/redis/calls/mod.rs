//! The script and transaction calls on one Redis master, and the decoding of their replies.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, RedisResult, Script, ScriptInvocation, ToRedisArgs, Value};

mod extend;
mod inspect;
mod native;

pub(crate) use inspect::{Looked, decode_inspect, inspect_invocation};

use super::keys::{KeyKind, LockKeys, redis_keys, server_fence_key, slot_fence_key};
use super::native::{Known, NativeCommands};
use crate::atomic_instant::AtomicInstant;
use crate::backend::scripts;
use crate::backend::wait_pool::WaitPool;
use crate::backend::{Ask, Attempt, Mode, Token, millis, millis_up};
use crate::config::Settings;
use crate::error::{FailureKind, NodeFailure};

/// The `WAIT` after every grant and renewal (`min_replicas`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MinReplicas {
    pub(crate) count: u32,
    pub(crate) timeout: Duration,
}

/// The script calls on one Redis master, over any connection that reaches it: a connection
/// manager, or a cluster connection (which sends each call to the master of its keys' slot; the
/// keys of one call then share a slot).
pub(crate) struct Calls {
    /// Named in failures.
    pub(crate) addr: String,
    prefix: String,
    /// Bound on one request, connection set-up included.
    deadline: Duration,
    /// How a release announces itself: `PUBLISH`, or `SPUBLISH` on a cluster.
    publish: &'static str,
    /// Replicas that must acknowledge each grant and renewal.
    replicas: Option<MinReplicas>,
    /// Whether a plain lock of one key without a fence may be taken with plain commands
    /// ([`Calls::acquire_plain`]): not through a cluster connection (which routes command by
    /// command), not with `min_replicas` (the grant goes through the script and its `WAIT`).
    plain: bool,
    /// The server's fence counter (`None`: a cluster, with one per slot).
    fence: Option<String>,
    /// With `min_replicas`, the connections grants and renewals (which end in `WAIT`) run on,
    /// one each; `None`: on the shared one (a cluster connection, which routes by slot).
    pub(super) waits: Option<WaitPool>,
    /// The let-go scripts (see [`Calls::let_go`]) and extension scripts this server answered
    /// since its last failure, one bit each ([`scripts::let_go_bit`]); `None` through a cluster
    /// connection, which routes a `SCRIPT LOAD` apart from the call it should precede.
    let_go_loaded: Option<AtomicU32>,
    /// Whether a starving waiter of a plain lock asks as a fair waiter (see [`Ask::starving`]):
    /// no more once the server refused the fair queue's commands (an ACL without them).
    queue_starving: AtomicBool,
    /// The lock's own commands this server has (see [`native`](super::native)), which release
    /// and renew a plain lock without a script; `None` through a cluster connection, which
    /// could ask any of its nodes (the scripts serve there).
    native: Option<Known>,
    /// Until when releases here go by script although the server has its
    /// own compare-and-delete: a native release met waiters within the last second (see
    /// [`release_native`](Self::release_native)).
    waited_until: AtomicInstant,
}

impl Calls {
    /// `server`: whether the connection reaches one server as it is (not a cluster connection,
    /// which routes each command by its keys' slot).
    pub(crate) fn new(
        addr: String,
        settings: &Settings,
        publish: &'static str,
        server: bool,
    ) -> Self {
        Calls {
            plain: server && settings.min_replicas.is_none(),
            let_go_loaded: server.then(|| AtomicU32::new(0)),
            native: server.then(Known::default),
            waited_until: AtomicInstant::default(),
            queue_starving: AtomicBool::new(true),
            fence: server.then(|| server_fence_key(&settings.key_prefix)),
            waits: None,
            addr,
            prefix: settings.key_prefix.clone(),
            deadline: settings.request_timeout(),
            publish,
            replicas: settings.min_replicas.map(|count| MinReplicas {
                count,
                // Within the request's own bound.
                timeout: settings.response_timeout / 2,
            }),
        }
    }

    /// See [`Node::queues_starving_waiters`](crate::backend::Node::queues_starving_waiters).
    pub(crate) fn queues_starving_waiters(&self) -> bool {
        self.queue_starving.load(Ordering::Relaxed)
    }

    pub(crate) fn keys(&self, name: &str) -> [String; 2] {
        redis_keys(&self.prefix, name)
    }

    /// The fence counter a grant of `name` counts on: the server's, or its slot's on a cluster.
    fn fence_key(&self, name: &str) -> String {
        match &self.fence {
            Some(key) => key.clone(),
            None => slot_fence_key(&self.prefix, name),
        }
    }

    fn lock_keys<'a>(&'a self, name: &'a str) -> LockKeys<'a> {
        LockKeys::new(&self.prefix, name)
    }

    async fn bounded<T>(
        &self,
        what: &str,
        fut: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, NodeFailure> {
        match tokio::time::timeout(self.deadline, fut).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(NodeFailure::from_redis(&self.addr, &err)),
            Err(_) => Err(NodeFailure::timeout(&self.addr, what)),
        }
    }

    /// Runs `invocation` of `script`, a call that must take effect even when its caller stops
    /// waiting for it (a release, a withdrawal, a keep): until this server has answered `script`
    /// since its last failure, `SCRIPT LOAD` goes ahead of the call in the same write. Otherwise
    /// a server that has not loaded it (first use, a restart) answers `NOSCRIPT`, and when that
    /// answer comes after the caller gave up (a frozen or slow server) nobody loads the script
    /// and sends the call again: the release is lost, and a grant that landed before it on the
    /// same connection stays for its whole ttl.
    async fn let_go<C: Conn>(
        &self,
        conn: &C,
        what: &str,
        call: &ScriptCall,
    ) -> Result<i64, NodeFailure> {
        let mut conn = conn.clone();
        let bit = scripts::let_go_bit(call.script);
        let preload = self.unloaded(bit) != 0;
        let loaded_with = |call: &ScriptCall| {
            let mut pipe = redis::pipe();
            pipe.load_script(call.script)
                .ignore()
                .add_command(call.cmd.clone());
            pipe
        };
        let reply = if preload {
            self.bounded(what, loaded_with(call).query_async::<(i64,)>(&mut conn))
                .await
                .map(|(value,)| value)
        } else {
            match self.bounded(what, call.cmd.query_async(&mut conn)).await {
                // The server lost its script cache (restart, SCRIPT FLUSH): load it with the call.
                Err(failure) if lost_script(&failure) => self
                    .bounded(what, loaded_with(call).query_async::<(i64,)>(&mut conn))
                    .await
                    .map(|(value,)| value),
                reply => reply,
            }
        };
        self.note_loaded(bit, reply.as_ref().map(drop));
        reply
    }

    /// Which of `bits` (scripts, see [`scripts::let_go_bit`]) this server has not answered
    /// since its last failure: a call of them loads them in the same write. None through a
    /// cluster connection.
    fn unloaded(&self, bits: u32) -> u32 {
        self.let_go_loaded
            .as_ref()
            .map_or(0, |loaded| bits & !loaded.load(Ordering::Acquire))
    }

    /// Notes how a call of the scripts `bits` went: answered, they are loaded; no answer, or a
    /// broken connection, and the server may come back without its scripts (restarted behind a
    /// reconnect): they are all loaded again with the next calls.
    fn note_loaded(&self, bits: u32, reply: Result<(), &NodeFailure>) {
        if let Some(loaded) = &self.let_go_loaded {
            match reply {
                Ok(()) => {
                    loaded.fetch_or(bits, Ordering::AcqRel);
                }
                Err(failure) if failure.kind.may_have_applied() => {
                    loaded.store(0, Ordering::Release);
                    self.forget_native();
                }
                Err(_) => {}
            }
        }
    }

    /// Runs `invocation` and, with `min_replicas`, `WAIT` behind it in one pipeline on one
    /// connection (a connection of its own, see [`WaitPool`]): the replica count then covers
    /// this script's writes. Reloads the script once if the server lost it.
    async fn invoke<C: Conn, T: FromRedisValue>(
        &self,
        conn: &C,
        what: &str,
        script: &Script,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<(T, Option<u32>), NodeFailure> {
        let Some(replicas) = self.replicas else {
            let mut conn = conn.clone();
            let value = self
                .bounded(what, invocation.invoke_async(&mut conn))
                .await?;
            return Ok((value, None));
        };
        let mut pipe = redis::pipe();
        pipe.invoke_script(invocation)
            .cmd("WAIT")
            .arg(replicas.count)
            .arg(millis(replicas.timeout));
        let Some(pool) = &self.waits else {
            return self
                .replicated(&mut conn.clone(), what, script, &pipe)
                .await;
        };
        let mut own = self.bounded("connect", pool.take()).await?;
        let reply = self.replicated(&mut own, what, script, &pipe).await;
        if reply.is_ok() {
            pool.give_back(own);
        }
        reply
    }

    /// Sends `pipe`, a script and `WAIT`, on `conn`; reloads the script once if the server lost
    /// it.
    async fn replicated<D: ConnectionLike + Send, T: FromRedisValue>(
        &self,
        conn: &mut D,
        what: &str,
        script: &Script,
        pipe: &redis::Pipeline,
    ) -> Result<(T, Option<u32>), NodeFailure> {
        let mut reply = self
            .bounded(what, pipe.query_async::<(T, u32)>(&mut *conn))
            .await;
        // The server lost its script cache (restart, SCRIPT FLUSH): load once and resend.
        if reply.as_ref().is_err_and(lost_script) {
            self.bounded("script load", script.load_async(&mut *conn))
                .await?;
            reply = self.bounded(what, pipe.query_async(&mut *conn)).await;
        }
        reply.map(|(value, acks)| (value, Some(acks)))
    }

    /// A failure saying that fewer than `min_replicas` replicas acknowledged `what`.
    fn too_few_replicas(&self, what: &str, acks: u32) -> NodeFailure {
        let (count, timeout) = self
            .replicas
            .map_or((0, Duration::ZERO), |r| (r.count, r.timeout));
        NodeFailure::replication(
            &self.addr,
            &format!(
                "{what}: {acks} of min_replicas {count} replicas acknowledged it within {timeout:?}"
            ),
        )
    }

    pub(crate) async fn force_release<C: Conn>(
        &self,
        conn: &C,
        name: &str,
    ) -> Result<bool, NodeFailure> {
        let [lock, channel] = self.keys(name);
        let mut invocation = scripts::FORCE_RELEASE.prepare_invoke();
        invocation.key(lock).arg(self.publish).arg(channel);
        let mut conn = conn.clone();
        let deleted: i64 = self
            .bounded("force release", invocation.invoke_async(&mut conn))
            .await?;
        Ok(deleted == 1)
    }

    pub(crate) async fn acquire<C: Conn>(
        &self,
        conn: &C,
        names: &[Arc<str>],
        token: &Token,
        ask: Ask,
    ) -> Result<Attempt, NodeFailure> {
        let queues = ask.starving
            && ask.mode == Mode::Exclusive
            && names.len() == 1
            && self.queue_starving.load(Ordering::Relaxed);
        let mode = if queues { Mode::Fair } else { ask.mode };
        let plain = self.plain && !ask.fencing && mode == Mode::Exclusive;
        if let [name] = names
            && plain
            && let Some(answer) = self.acquire_plain(conn, name, token, ask).await
        {
            return answer;
        }
        // Boxed: a script's call (with its reload, or `WAIT` behind it) makes a future several
        // times the size of the plain `SET`'s, which every plain lock would otherwise carry, and
        // copy, up through every future that awaits it.
        Box::pin(self.acquire_scripted(conn, names, token, ask, mode, queues, plain)).await
    }

    /// [`acquire`](Self::acquire) by a script: a fenced or fair lock, a shared one, several
    /// keys, or a plain one whose key the plain `SET` cannot answer for (`plain`: it was asked).
    /// `mode`: the one asked for, or `Fair` for a starving waiter that `queues`.
    #[allow(clippy::too_many_arguments)]
    async fn acquire_scripted<C: Conn>(
        &self,
        conn: &C,
        names: &[Arc<str>],
        token: &Token,
        ask: Ask,
        mode: Mode,
        queues: bool,
        plain: bool,
    ) -> Result<Attempt, NodeFailure> {
        let Ask {
            ttl,
            fencing,
            mode: asked,
            queue,
            waits,
            lease,
            starving: _,
            marks: _,
            pause_ran_out: _,
        } = ask;
        // What a starving waiter asks for where it cannot queue.
        let unqueued = Ask {
            starving: false,
            ..ask
        };
        if let [name] = names
            && mode == Mode::Exclusive
            && !plain
            && let Some(answer) = self.acquire_one(conn, name, token, ask).await
        {
            return answer;
        }
        let flag = |on: bool| if on { "1" } else { "0" };
        let script = match mode {
            Mode::Exclusive => &scripts::ACQUIRE,
            Mode::Fair => &scripts::FAIR_ACQUIRE,
            Mode::Shared | Mode::Permits(_) => &scripts::SHARED_ACQUIRE,
        };
        let mut invocation = script.prepare_invoke();
        match mode {
            Mode::Exclusive => {
                for name in names {
                    invocation.key(self.lock_keys(name).of(KeyKind::Lock));
                }
                for name in names {
                    invocation.key(self.fence_key(name));
                }
                for name in names {
                    invocation.key(self.lock_keys(name).of(KeyKind::Waiting));
                }
            }
            Mode::Fair | Mode::Shared | Mode::Permits(_) => {
                let keys = self.lock_keys(&names[0]);
                invocation
                    .key(keys.of(KeyKind::Lock))
                    .key(self.fence_key(&names[0]));
                if mode == Mode::Fair {
                    invocation
                        .key(keys.of(KeyKind::Queue))
                        .key(keys.of(KeyKind::QueueLeases));
                }
                invocation.key(keys.of(KeyKind::Waiting));
            }
        }
        invocation
            .arg(token.as_str())
            .arg(millis(ttl))
            .arg(flag(fencing));
        match mode {
            // How long a writer's mark keeps readers out (0: it does not wait).
            Mode::Exclusive => invocation.arg(if queue { millis(waits).max(1) } else { 0 }),
            Mode::Fair => invocation.arg(flag(queue)).arg(millis(lease)),
            Mode::Shared => invocation.arg(0),
            Mode::Permits(n) => invocation.arg(n),
        };
        if matches!(mode, Mode::Shared | Mode::Permits(_)) {
            // How long a reader refused by an exclusive holder marks it waited for.
            invocation.arg(if queue {
                millis(waits.min(lease)).max(1)
            } else {
                0
            });
        }
        let (reply, acks): (Vec<i64>, _) =
            match self.invoke(conn, "acquire", script, &invocation).await {
                Err(failure) if queues && failure.kind == FailureKind::Permission => {
                    // An ACL without the fair queue's commands: starving waiters of plain locks
                    // wait unqueued from now on, as they did before the threshold.
                    self.queue_starving.store(false, Ordering::Relaxed);
                    return Box::pin(self.acquire(conn, names, token, unqueued)).await;
                }
                answered => answered?,
            };
        match reply.as_slice() {
            [1, fences @ ..] if fences.len() == names.len() => {
                self.granted(conn, names, token, mode, fencing, fences, acks)
                    .await
            }
            // `FAIR_ACQUIRE` adds the ticket and whether the holder announces its release;
            // `ACQUIRE` does not tell (a multi-key lock or a writer's: its waiter polls).
            [0, index, pttl, rest @ ..] if rest.len() <= 2 => Ok(Attempt::Held {
                index: usize::try_from(*index - 1).unwrap_or(0),
                // -1: the key has no expiry (set by someone else without one); wait by backoff.
                pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
                ticket: rest
                    .first()
                    .and_then(|t| u64::try_from(*t).ok())
                    .filter(|t| *t > 0),
                announced: rest.get(1) == Some(&1),
            }),
            [2, ..] if queues => {
                // The key is a shared lock or a semaphore, which has no queue: a writer waits
                // there with its mark (the plain attempt's), a plain caller with its mismatch.
                Box::pin(self.acquire(conn, names, token, unqueued)).await
            }
            [2, index, other] => {
                let key = names
                    .get(usize::try_from(*index - 1).unwrap_or(0))
                    .unwrap_or(&names[0]);
                Ok(Attempt::mismatch(key, asked, *other))
            }
            _ => Err(NodeFailure::response(
                &self.addr,
                "acquire: unexpected reply",
            )),
        }
    }

    /// A grant's reply (`fences`: one per name, 0 without fencing), checked against
    /// `min_replicas`' acknowledgements (`acks`): a grant too few replicas acknowledged is
    /// given back and answered as a failure. It is given back as a release, waking the waiters:
    /// it was a real key while the replicas were awaited, and the waiters it refused meanwhile
    /// marked the lock and sleep on the strength of its announcement.
    #[allow(clippy::too_many_arguments)]
    async fn granted<C: Conn>(
        &self,
        conn: &C,
        names: &[Arc<str>],
        token: &Token,
        mode: Mode,
        fencing: bool,
        fences: &[i64],
        acks: Option<u32>,
    ) -> Result<Attempt, NodeFailure> {
        if let (Some(acks), Some(replicas)) = (acks, self.replicas)
            && acks < replicas.count
        {
            let short = self.too_few_replicas("grant", acks);
            return match self.release(conn, names, token, mode, true).await {
                Ok(_) => Err(short),
                Err(failure) => Err(NodeFailure {
                    detail: format!("{}; withdrawing it failed too", short.detail),
                    ..failure
                }),
            };
        }
        Ok(Attempt::Acquired {
            fences: if fencing {
                fences
                    .iter()
                    .map(|f| u64::try_from(*f).unwrap_or(0))
                    .collect()
            } else {
                Vec::new()
            },
        })
    }

    /// An exclusive lock of one key by [`scripts::ACQUIRE_ONE`]: `SET NX PX GET`, and with a
    /// fence the counter's `INCR` and `TIME`, in one call. `None` when the key is not a string
    /// (a shared lock or semaphore): [`scripts::ACQUIRE`] then marks a waiting writer or reports
    /// the mismatch.
    async fn acquire_one<C: Conn>(
        &self,
        conn: &C,
        name: &Arc<str>,
        token: &Token,
        ask: Ask,
    ) -> Option<Result<Attempt, NodeFailure>> {
        let script: &Script = &scripts::ACQUIRE_ONE;
        let keys = self.lock_keys(name);
        let mut invocation = script.prepare_invoke();
        invocation
            .key(keys.of(KeyKind::Lock))
            .key(self.fence_key(name))
            .key(keys.of(KeyKind::Waiting))
            .arg(token.as_str())
            .arg(millis(ask.ttl))
            .arg(if ask.fencing { "1" } else { "0" })
            .arg(if ask.queue && ask.marks {
                millis(ask.waits.min(ask.lease)).max(1)
            } else {
                0
            });
        let (reply, acks): (Vec<i64>, _) =
            match self.invoke(conn, "acquire", script, &invocation).await {
                Ok(reply) => reply,
                Err(failure) => return Some(Err(failure)),
            };
        let names = std::slice::from_ref(name);
        Some(match reply.as_slice() {
            [1, fence] => {
                self.granted(
                    conn,
                    names,
                    token,
                    Mode::Exclusive,
                    ask.fencing,
                    &[*fence],
                    acks,
                )
                .await
            }
            [0, 1, pttl, announced] => Ok(Attempt::Held {
                index: 0,
                // -1: the key has no expiry (set by someone else without one); wait by backoff.
                pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
                ticket: None,
                announced: *announced == 1,
            }),
            [3] => return None,
            _ => Err(NodeFailure::response(
                &self.addr,
                "acquire: unexpected reply",
            )),
        })
    }

    /// A plain lock of one key without a fence, asked for as a hand-written lock does: one
    /// `SET NX PX GET`, no script. A refused caller that waits then marks the lock waited for
    /// (its waiting flag, made or lengthened but never shortened, since another waiter's mark
    /// may outlast this one's; until its next attempt at the latest: its lease, or the rest of its
    /// wait when shorter, so a waiter that gives up leaves the flag no longer; a release that
    /// finds no flag wakes nobody, see [`scripts::EXCLUSIVE_RELEASE`]) and reads its time to live, which bounds the wait, in
    /// a second round trip: the flag first, so that a release that did not see it came before
    /// the `PTTL`, which then says the lock is free (ask again at once). One that lost a
    /// wake-up's race ([`Ask::marks`] false) sleeps until it starves whatever a release says:
    /// its refusal costs the `SET` alone.
    /// `None` when the script must answer: the key holds our token already (a resent attempt:
    /// the script refreshes it), or is of another type (a shared lock or semaphore: the script
    /// marks a waiting writer or reports the mismatch).
    async fn acquire_plain<C: Conn>(
        &self,
        conn: &C,
        name: &str,
        token: &Token,
        ask: Ask,
    ) -> Option<Result<Attempt, NodeFailure>> {
        let keys = self.lock_keys(name);
        let lock = keys.arg(KeyKind::Lock);
        // Each command sized up front: no buffer grows while it is written.
        let command = |name: &str, args: usize, bytes: usize| {
            let mut cmd = Cmd::with_capacity(args + 1, name.len() + bytes);
            cmd.arg(name);
            cmd
        };
        let mut set = command("SET", 6, lock.len() + token.as_str().len() + 32);
        set.arg(&lock)
            .arg(token.as_str())
            .arg("NX")
            .arg("PX")
            .arg(millis(ask.ttl))
            .arg("GET");
        let mut c = conn.clone();
        let unexpected = || {
            Some(Err(NodeFailure::response(
                &self.addr,
                "acquire: unexpected reply",
            )))
        };
        let reply: Value = match self.bounded("acquire", set.query_async(&mut c)).await {
            Ok(reply) => reply,
            // Another type (WRONGTYPE): the script answers.
            Err(failure) if failure.kind == FailureKind::Response => return None,
            Err(failure) => return Some(Err(failure)),
        };
        let announced = match reply {
            Value::Nil => return Some(Ok(Attempt::Acquired { fences: Vec::new() })),
            Value::BulkString(holder) if holder.as_slice() == token.as_str().as_bytes() => {
                return None;
            }
            Value::BulkString(holder) => crate::owner::is_ours(&holder),
            _ => return unexpected(),
        };
        if !ask.queue || !ask.marks {
            // It does not wait, or sleeps until it starves whatever a release says: nothing
            // to mark, and no wait to bound.
            return Some(Ok(Attempt::Held {
                index: 0,
                pttl: None,
                ticket: None,
                announced,
            }));
        }
        // Made, or made to live longer, never shorter: another waiter's mark may outlast this
        // one's wait (a plain `SET .. PX` replaced it, and a waiter with a short wait then cut a
        // long waiter's mark, whose release came to nobody), and in one step with the `PTTL`
        // read (see the script). Both found by the model, `lock-model/tests/found.rs`.
        let ms = millis(ask.waits.min(ask.lease)).max(1);
        let mut invocation = scripts::MARK_AND_PTTL.prepare_invoke();
        invocation
            .key(keys.of(KeyKind::Waiting))
            .key(keys.of(KeyKind::Lock))
            .arg(ms);
        let pttl: i64 = match self
            .bounded("acquire", invocation.invoke_async(&mut c))
            .await
        {
            Ok(pttl) => pttl,
            Err(failure) => return Some(Err(failure)),
        };
        Some(Ok(Attempt::Held {
            index: 0,
            pttl: match pttl {
                // The holder let go since the `SET`: ask again soon.
                -2 => Some(Duration::ZERO),
                // -1: no expiry (set by someone else without one): wait by backoff.
                pttl => u64::try_from(pttl).ok().map(Duration::from_millis),
            },
            ticket: None,
            announced,
        }))
    }

    pub(crate) async fn release<C: Conn>(
        &self,
        conn: &C,
        names: &[Arc<str>],
        token: &Token,
        mode: Mode,
        wake: bool,
    ) -> Result<bool, NodeFailure> {
        // A plain lock's release, where the server has a compare-and-delete of its own.
        let native = self.native.as_ref().and_then(Known::get);
        if let Some(how) = native.and_then(NativeCommands::release)
            && mode == Mode::Exclusive
            && wake
            && names.len() == 1
            && std::time::Instant::now() >= self.waited_until.load()
            && let Some(answer) = self.release_native(conn, &names[0], token, how).await
        {
            return answer;
        }
        let call = match (mode, names) {
            (Mode::Exclusive, _) if names.len() > 1 => {
                let keys: Vec<LockKeys<'_>> = names.iter().map(|n| self.lock_keys(n)).collect();
                let mut call = ScriptCall::new(&scripts::RELEASE, keys.len());
                call.locks(&keys).arg(token.as_str()).arg(self.publish);
                for k in &keys {
                    call.channel(k, wake);
                }
                call
            }
            (Mode::Exclusive | Mode::Fair, _) => {
                // One key with a queue: a fair lock's waiters, or a plain lock's that waited past
                // their threshold. Always with its channel, withdrawal or not: leaving the queue
                // may hand the lock to the next waiter, who must be woken.
                let fair = mode == Mode::Fair;
                self.queued_release(&self.lock_keys(&names[0]), token, fair, wake_arg(wake))
            }
            (Mode::Shared | Mode::Permits(_), _) => {
                let keys = self.lock_keys(&names[0]);
                let mut call = ScriptCall::new(&scripts::SHARED_RELEASE, 1);
                call.arg(keys.arg(KeyKind::Lock))
                    .arg(token.as_str())
                    .arg(self.publish)
                    .channel(&keys, wake);
                call
            }
        };
        let deleted = if native.is_none() && self.native.is_some() {
            // Not asked yet: in the same round trip as this release, by script.
            let (_, deleted) =
                futures_util::join!(self.learn_native(conn), self.let_go(conn, "release", &call));
            deleted?
        } else {
            self.let_go(conn, "release", &call).await?
        };
        Ok(usize::try_from(deleted) == Ok(names.len()))
    }

    /// [`scripts::FAIR_RELEASE`] (`fair`) or [`scripts::EXCLUSIVE_RELEASE`] of one key's lock
    /// for `token`; `wake` is the exclusive script's `ARGV[4]` ("1" a release, "0" a withdrawal,
    /// "2" the wake-up after a native release), which the fair script does not take.
    fn queued_release(
        &self,
        keys: &LockKeys<'_>,
        token: &Token,
        fair: bool,
        wake: &'static str,
    ) -> ScriptCall {
        let script = if fair {
            &scripts::FAIR_RELEASE
        } else {
            &scripts::EXCLUSIVE_RELEASE
        };
        let mut call = ScriptCall::new(script, if fair { 3 } else { 4 });
        call.arg(keys.arg(KeyKind::Lock))
            .arg(keys.arg(KeyKind::Queue))
            .arg(keys.arg(KeyKind::QueueLeases));
        if !fair {
            call.arg(keys.arg(KeyKind::Waiting));
        }
        call.arg(token.as_str())
            .arg(self.publish)
            .arg(keys.arg(KeyKind::Released))
            .arg(wake);
        call
    }

    /// Compares the token on every key and `PEXPIRE`s each to `left` (the [`scripts::EXTEND`]
    /// script with `left` as its ttl): the release of a lock whose `min_hold` has not passed.
    /// Nothing is published, so no waiter is woken for a key that is not free.
    pub(crate) async fn keep<C: Conn>(
        &self,
        conn: &C,
        names: &[Arc<str>],
        token: &Token,
        left: Duration,
    ) -> Result<bool, NodeFailure> {
        let keys: Vec<LockKeys<'_>> = names.iter().map(|n| self.lock_keys(n)).collect();
        let mut call = ScriptCall::new(&scripts::EXTEND, keys.len());
        call.locks(&keys).arg(token.as_str()).arg(millis_up(left));
        let kept = self.let_go(conn, "release for min_hold", &call).await?;
        Ok(kept == 1)
    }

    pub(crate) async fn raise_fences<C: Conn>(
        &self,
        conn: &C,
        names: &[Arc<str>],
        fences: &[u64],
    ) -> Result<(), NodeFailure> {
        let mut invocation = scripts::RAISE_FENCE.prepare_invoke();
        for (name, fence) in names.iter().zip(fences) {
            invocation.key(self.fence_key(name)).arg(*fence);
        }
        let mut conn = conn.clone();
        self.bounded("raise fence", invocation.invoke_async::<i64>(&mut conn))
            .await
            .map(drop)
    }
}

/// Whether `failure` says that the server does not have the script (a restart, `SCRIPT FLUSH`).
fn lost_script(failure: &NodeFailure) -> bool {
    failure.kind == FailureKind::Response
        && (failure.detail.contains("NOSCRIPT") || failure.detail.contains("NoScript"))
}

/// A script's `EVALSHA`, its keys and arguments written straight into one command (a
/// [`ScriptInvocation`] keeps each in a buffer of its own, then copies them into the command: two
/// allocations per key or argument, on every release). The keys go first.
struct ScriptCall {
    script: &'static Script,
    cmd: Cmd,
}

impl ScriptCall {
    fn new(script: &'static Script, keys: usize) -> Self {
        let mut cmd = Cmd::with_capacity(11 + keys, 400);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        ScriptCall { script, cmd }
    }

    fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// The lock key of each of `keys`.
    fn locks(&mut self, keys: &[LockKeys<'_>]) -> &mut Self {
        for k in keys {
            self.arg(k.arg(KeyKind::Lock));
        }
        self
    }

    /// The release channel of `keys` with `wake`, else an empty one (the release wakes nobody).
    fn channel(&mut self, keys: &LockKeys<'_>, wake: bool) -> &mut Self {
        if wake {
            self.arg(keys.arg(KeyKind::Released))
        } else {
            self.arg("")
        }
    }
}

/// [`scripts::EXCLUSIVE_RELEASE`]'s `ARGV[4]` for a release (`wake`) or a withdrawal.
fn wake_arg(wake: bool) -> &'static str {
    if wake { "1" } else { "0" }
}

/// A connection [`Calls`] can use.
pub(crate) trait Conn: ConnectionLike + Clone + Send + Sync + 'static {}

impl<T: ConnectionLike + Clone + Send + Sync + 'static> Conn for T {}
