//! What one Redis master holds of a lock: the inspect script's call and the reading of its reply.

use std::time::Duration;

use redis::{Script, ScriptInvocation, Value};

use super::{Calls, Conn};
use crate::backend::redis::keys::{KeyKind, LockKeys};
use crate::backend::{NodeHold, Token, scripts};
use crate::error::NodeFailure;

/// What a look at a lock's key found (see [`Calls::look`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Looked {
    /// The key holds the token.
    Ours,
    /// It does not: the holder's time to live, when the server said (zero: the key is free).
    Not(Option<Duration>),
}

impl Calls {
    /// Whether the lock `name` holds `token` now, and if not, the holder's time to live: `GET`
    /// and `PTTL` in one round trip. What a queued waiter asks once the subscription to its own
    /// channel is confirmed: a hand-off to it before then went unheard, and shows in the key (the
    /// fair attempt it asked with before runs about a dozen commands on the server; it now
    /// follows only when the key holds its token, and takes the lock).
    pub(crate) async fn look<C: Conn>(
        &self,
        conn: &C,
        name: &str,
        token: &Token,
    ) -> Result<Looked, NodeFailure> {
        let keys = self.lock_keys(name);
        let lock = keys.arg(KeyKind::Lock);
        let mut pipe = redis::Pipeline::with_capacity(2);
        pipe.cmd("GET").arg(&lock).cmd("PTTL").arg(&lock);
        let mut conn = conn.clone();
        let (holder, pttl): (Option<Vec<u8>>, i64) =
            self.bounded("look", pipe.query_async(&mut conn)).await?;
        let left = match pttl {
            // Gone between the two commands, or no key: free.
            -2 => Some(Duration::ZERO),
            pttl => u64::try_from(pttl).ok().map(Duration::from_millis),
        };
        Ok(match holder {
            Some(holder) if holder == token.as_str().as_bytes() => Looked::Ours,
            _ => Looked::Not(left),
        })
    }

    pub(crate) async fn inspect<C: Conn>(
        &self,
        conn: &C,
        name: &str,
    ) -> Result<Option<NodeHold>, NodeFailure> {
        let invocation = inspect_invocation(&self.prefix, name);
        let mut conn = conn.clone();
        let reply: Vec<Value> = self
            .bounded("inspect", invocation.invoke_async(&mut conn))
            .await?;
        decode_inspect(&reply)
            .ok_or_else(|| NodeFailure::response(&self.addr, "inspect: unexpected reply"))
    }
}

/// The inspect script's call (see [`scripts::INSPECT`]) for the lock `name` under `prefix`: its
/// KEYS are set, it takes no ARGV.
pub(crate) fn inspect_invocation(prefix: &str, name: &str) -> ScriptInvocation<'static> {
    let keys = LockKeys::new(prefix, name);
    let script: &'static Script = &scripts::INSPECT;
    let mut invocation = script.prepare_invoke();
    invocation
        .key(keys.of(KeyKind::Lock))
        .key(keys.of(KeyKind::QueueLeases));
    invocation
}

/// Reads the inspect script's reply (see [`scripts::INSPECT`]): `Some(None)` when the lock is
/// not held, `None` when the reply is not one of the script's.
pub(crate) fn decode_inspect(reply: &[Value]) -> Option<Option<NodeHold>> {
    let int = |v: &Value| match v {
        Value::Int(n) => Some(*n),
        _ => None,
    };
    let count = |n: i64| usize::try_from(n).unwrap_or(0);
    match reply {
        [only] if int(only) == Some(-2) => Some(None),
        [pttl, holders, queued, records @ ..] => {
            let mut owners = Vec::with_capacity(records.len());
            for record in records {
                let Value::BulkString(record) = record else {
                    return None;
                };
                owners.extend(crate::owner::parse(record));
            }
            Some(Some(NodeHold {
                remaining: u64::try_from(int(pttl)?).ok().map(Duration::from_millis),
                // One fence counter per server, not a token per lock: the holder's token is
                // its own to know.
                fencing_token: None,
                holders: count(int(holders)?),
                queued: count(int(queued)?),
                owners,
            }))
        }
        _ => None,
    }
}
