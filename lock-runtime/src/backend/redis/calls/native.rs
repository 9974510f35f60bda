//! The lock's own server commands on one Redis master (see [`native`](super::super::native)):
//! which it has, the release by `DELIFEQ` or `DELEX .. IFEQ`, and when to leave them to the
//! scripts.

use std::time::{Duration, Instant};

use redis::{Cmd, Value};

use super::{Calls, Conn};
use crate::backend::Token;
use crate::backend::redis::keys::KeyKind;
use crate::backend::redis::native::{NativeCommands, NativeRelease, Refusal, refusal};
use crate::error::NodeFailure;

impl Calls {
    /// After a failure that may mean another server answers now (restarted behind a
    /// reconnect, or promoted): ask it again which native commands it has.
    pub(super) fn forget_native(&self) {
        if let Some(known) = &self.native {
            known.forget();
        }
    }

    /// Asks the server which of the lock's own commands it has, once (and again after a
    /// failure, see [`forget_native`](Self::forget_native)); an error reply (an ACL without
    /// `COMMAND`, a server without `COMMAND DOCS`) means none.
    pub(super) async fn learn_native<C: Conn>(&self, conn: &C) {
        let Some(known) = &self.native else { return };
        let mut query = Cmd::new();
        for word in NativeCommands::QUERY {
            query.arg(word);
        }
        let mut c = conn.clone();
        match self
            .bounded("command docs", query.query_async::<Value>(&mut c))
            .await
        {
            Ok(docs) => {
                let found = NativeCommands::from_command_docs(&docs);
                tracing::debug!(
                    server = %self.addr,
                    native_release = ?found.release(),
                    native_renewal = found.renew(),
                    "asked the server for the lock's own commands"
                );
                known.learn(found);
            }
            Err(failure) if refusal(failure.kind, None) == Refusal::Refused => {
                tracing::debug!(server = %self.addr, %failure, "could not ask for native commands: scripts");
                known.learn(NativeCommands::default());
            }
            // No answer: ask again with a later release.
            Err(_) => {}
        }
    }

    /// Releases a plain lock of one key with the server's own compare-and-delete (`DELIFEQ`, or
    /// `DELEX .. IFEQ`) and, in the same round trip, `EXISTS` on its waiting flag: when nobody
    /// waits (the common case) that is the whole release, with no script. The flag is read after
    /// the delete, so a waiter refused before it either set the flag before the read (and is
    /// woken here) or reads the lock's time to live after the delete (and asks again at once, see
    /// [`acquire_plain`](Self::acquire_plain)). When someone waits, [`scripts::EXCLUSIVE_RELEASE`](crate::backend::scripts::EXCLUSIVE_RELEASE)
    /// follows as a wake-up ("2": the lock was deleted already): if the lock is still free, it
    /// hands it to the first waiter in line or wakes every waiter, and deletes the flag, as a
    /// scripted release does; if someone took the lock in between, it wakes the waiters all the
    /// same (queued ones wait for that holder's release to hand it on); and the server's
    /// releases of the next second go by script, which deletes and wakes in one round trip (a
    /// lock someone waits for is mostly released again soon). A wake-up that fails
    /// leaves the waiters to find the lock free when they next look (their backoff), and the
    /// release stands.
    ///
    /// `None` when the script must answer: the key is not a string (a shared lock or a
    /// semaphore), the lock was not ours while someone waits (the script also tidies the
    /// queue), or the server refused the command (then the scripts serve from now on, and a
    /// debug line says so once).
    pub(super) async fn release_native<C: Conn>(
        &self,
        conn: &C,
        name: &str,
        token: &Token,
        how: NativeRelease,
    ) -> Option<Result<bool, NodeFailure>> {
        let keys = self.lock_keys(name);
        let lock = keys.arg(KeyKind::Lock);
        let waiting = keys.arg(KeyKind::Waiting);
        let mut delete = Cmd::with_capacity(4, lock.len() + token.as_str().len() + 16);
        match how {
            NativeRelease::Delifeq => delete.arg("DELIFEQ").arg(&lock),
            NativeRelease::DelexIfeq => delete.arg("DELEX").arg(&lock).arg("IFEQ"),
        }
        .arg(token.as_str());
        let mut exists = Cmd::with_capacity(2, waiting.len() + 8);
        exists.arg("EXISTS").arg(&waiting);
        let mut pipe = redis::Pipeline::with_capacity(2);
        pipe.add_command(delete).add_command(exists);
        let mut c = conn.clone();
        let reply = tokio::time::timeout(self.deadline, pipe.query_async::<(i64, i64)>(&mut c));
        let (deleted, waited) = match reply.await {
            Ok(Ok(reply)) => reply,
            Ok(Err(err)) => {
                let failure = NodeFailure::from_redis(&self.addr, &err);
                match refusal(failure.kind, err.code()) {
                    Refusal::NotAString => return None,
                    Refusal::Refused => {
                        if let Some(known) = &self.native {
                            known.refused_release();
                        }
                        tracing::debug!(
                            server = %self.addr,
                            %failure,
                            "the server refused its own compare-and-delete: releasing by script"
                        );
                        return None;
                    }
                    Refusal::Failed => {
                        if failure.kind.may_have_applied() {
                            self.forget_native();
                        }
                        return Some(Err(failure));
                    }
                }
            }
            Err(_) => {
                self.forget_native();
                return Some(Err(NodeFailure::timeout(&self.addr, "release")));
            }
        };
        match (deleted, waited) {
            (1, 0) => Some(Ok(true)),
            (1, _) => {
                // Someone waits: the next second's releases on this server go by script, which
                // deletes and wakes in one round trip (a contended lock is released again soon).
                self.waited_until.fetch_max(Instant::now() + WAITED_FOR);
                let call = self.queued_release(&keys, token, false, "2");
                if let Err(failure) = self.let_go(conn, "wake-up", &call).await {
                    tracing::debug!(
                        server = %self.addr,
                        %failure,
                        "a release's wake-up failed: waiters find the lock free when they next look"
                    );
                }
                Some(Ok(true))
            }
            (_, 0) => Some(Ok(false)),
            _ => None,
        }
    }
}

/// How long releases on a server go by script after a native release there met waiters.
const WAITED_FOR: Duration = Duration::from_secs(1);
