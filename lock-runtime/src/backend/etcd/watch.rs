//! Waiting: one watch per waiter over a lock's keys, for deletions, and the wake-ups they bring.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use etcd_client::{EventType, KeyValue, Txn, WatchFilterType, WatchOptions};

use super::kinds::{self, Keys, Part, Tag};
use super::node::{Inner, kvs};
use crate::backend::Subscription;

/// A name this client watches: each of its waiters has a watch of its own, and the first watch
/// to see a deletion wakes them all.
pub(super) struct Watched {
    refs: usize,
    /// The revision of the last deletions that woke the waiters.
    woken: i64,
}

impl Inner {
    fn watched(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watched>> {
        self.watched.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A waiter's watch of `name` ([`Node::watch`](crate::backend::Node::watch)).
    ///
    /// One watch per waiter over `K` and every entry under it, for deletions; the first of a
    /// client's watches of a name to see a deletion wakes that client's waiters. When only fair
    /// entries left, only the new first in line is woken (its ticket is its entry's create
    /// revision), with the waiters that have no ticket.
    pub(super) fn subscribe(self: &Arc<Self>, name: &str) -> Subscription {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Subscription {
                confirmed: Box::pin(async { false }),
                keep: None,
            };
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.watched()
            .entry(name.to_owned())
            .or_insert(Watched { refs: 0, woken: 0 })
            .refs += 1;
        let task = runtime.spawn(Arc::clone(self).watch_loop(name.to_owned(), tx));
        Subscription {
            confirmed: Box::pin(async move { rx.await.unwrap_or(false) }),
            keep: Some(Box::new(Unwatch {
                task,
                inner: Arc::clone(self),
                name: name.to_owned(),
            })),
        }
    }

    /// Wakes this client's waiters of `name` on each deletion of its key or of an entry under
    /// it, for as long as the task runs (the subscription aborts it). `confirmed` learns whether
    /// the first watch was set up; a broken watch wakes the waiters (a release may have been
    /// missed) and is set up again.
    async fn watch_loop(
        self: Arc<Self>,
        name: String,
        confirmed: tokio::sync::oneshot::Sender<bool>,
    ) {
        let keys = self.keys(&name);
        let (start, end) = keys.watch_range();
        let mut confirmed = Some(confirmed);
        let mut pause = Duration::from_millis(50);
        loop {
            let i = self.preferred.load(Ordering::Relaxed) % self.members.len();
            let options = WatchOptions::new()
                .with_range(end.clone())
                .with_filters([WatchFilterType::NoPut]);
            let open = async {
                let mut client = self.client(i).await?;
                client.watch(start.clone(), Some(options)).await
            };
            let bound = self.connect_timeout + self.response_timeout;
            if let Ok(Ok(mut stream)) = tokio::time::timeout(bound, open).await {
                while let Ok(Some(resp)) = stream.message().await {
                    if resp.created() {
                        pause = Duration::from_millis(50);
                        if let Some(tx) = confirmed.take() {
                            let _ = tx.send(true);
                        }
                    }
                    let deleted: Vec<&KeyValue> = resp
                        .events()
                        .iter()
                        .filter(|e| e.event_type() == EventType::Delete)
                        .filter_map(|e| e.kv())
                        .collect();
                    let revision = deleted.iter().map(|kv| kv.mod_revision()).max();
                    if revision.is_some_and(|r| self.first_to_wake(&name, r)) {
                        let parts: Vec<Part> =
                            deleted.iter().map(|kv| keys.part(kv.key())).collect();
                        self.wake(&name, &keys, &parts).await;
                    }
                    if resp.canceled() {
                        break;
                    }
                }
            }
            match confirmed.take() {
                Some(tx) => {
                    let _ = tx.send(false);
                }
                None => self.wakers.notify(&name),
            }
            self.preferred
                .store((i + 1) % self.members.len(), Ordering::Relaxed);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Whether the deletions at `revision` are news to this client: each of its watches of
    /// `name` sees them, and one wake-up is enough.
    fn first_to_wake(&self, name: &str, revision: i64) -> bool {
        match self.watched().get_mut(name) {
            Some(w) if w.woken >= revision => false,
            Some(w) => {
                w.woken = revision;
                true
            }
            None => true,
        }
    }

    /// Wakes the waiters of `name` after the deletion of `parts`. When only fair queue entries
    /// left, the lock can only have passed to the new first in line: only that waiter is woken
    /// (its ticket is its entry's create revision), along with waiters that have no ticket.
    async fn wake(&self, name: &str, keys: &Keys, parts: &[Part]) {
        if parts.is_empty() || parts.iter().any(|p| *p != Part::Entry(Tag::Queue)) {
            self.wakers.notify(name);
            return;
        }
        let head = kinds::oldest_in(keys.range(Tag::Queue, Tag::Queue), 1);
        let head = match self.txn("queue head", Txn::new().and_then([head])).await {
            Ok(resp) => kvs(&resp).into_iter().flatten().next(),
            Err(_) => None,
        };
        match head.and_then(|kv| u64::try_from(kv.create_revision()).ok()) {
            Some(ticket) => self.wakers.notify_for(name, ticket, None),
            None => self.wakers.notify(name),
        }
    }
}

/// Ends a watch when its subscription is dropped.
struct Unwatch {
    task: tokio::task::JoinHandle<()>,
    inner: Arc<Inner>,
    name: String,
}

impl Drop for Unwatch {
    fn drop(&mut self) {
        self.task.abort();
        let mut watched = self.inner.watched();
        if let Some(w) = watched.get_mut(&self.name) {
            w.refs -= 1;
            if w.refs == 0 {
                watched.remove(&self.name);
            }
        }
    }
}
