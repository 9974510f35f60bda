//! Keyspace notifications of one server, each recorded with the instant it arrived: proof that a
//! late request reached Redis (`set`: a grant landed), and of what removed a key afterwards
//! (`del`: a release; `expired`: its ttl; `evicted`); and the messages published on a channel
//! (a release's wake-up).

// A harness failure should stop the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::server::RedisServer;

/// How long the recording thread blocks on a read before it looks at its stop flag.
const READ_TIMEOUT: Duration = Duration::from_millis(100);
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(2);
/// The prefix of keyspace notification channels (database 0).
const KEYSPACE: &str = "__keyspace@0__:";

/// What a [`KeyEvents`] listens to.
enum Subscription {
    /// The keyspace events of the keys matching a glob.
    Keyspace(String),
    /// The messages published on a channel.
    Channel(String),
}

/// One keyspace event: what happened to `key`, and when this process heard of it (on loopback,
/// a millisecond or so after the server did it; a frozen server's events arrive once it thaws).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEvent {
    /// When the notification arrived.
    pub at: Instant,
    /// The key (without the `__keyspace@0__:` prefix).
    pub key: String,
    /// The event: `set`, `expire`, `del`, `expired`, `evicted`, ...
    pub event: String,
}

/// The keyspace events of the keys matching a pattern on one server, recorded from
/// [`watch`](Self::watch) on by a thread of its own, until dropped (or the server goes away).
#[derive(Debug)]
pub struct KeyEvents {
    seen: Arc<Mutex<Vec<KeyEvent>>>,
    stop: Arc<AtomicBool>,
}

impl KeyEvents {
    /// Turns keyspace notifications on for every event class (`notify-keyspace-events KA`) and
    /// records the events of the keys matching `pattern` (a `PSUBSCRIBE` glob, e.g. the lock key
    /// itself, or `lock:test:*`). Returns once subscribed.
    pub fn watch(server: &RedisServer, pattern: &str) -> KeyEvents {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg("KA")
            .query(&mut server.admin())
            .unwrap();
        Self::record(server, Subscription::Keyspace(pattern.to_owned()))
    }

    /// Records every message published on `channel` (a lock's release channel, say) as an event
    /// of the "key" `channel` whose `event` is the message: a release's wake-up is an empty one.
    /// Returns once subscribed.
    pub fn published(server: &RedisServer, channel: &str) -> KeyEvents {
        Self::record(server, Subscription::Channel(channel.to_owned()))
    }

    fn record(server: &RedisServer, what: Subscription) -> KeyEvents {
        let mut conn = server.admin();
        conn.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (subscribed_tx, subscribed) = std::sync::mpsc::channel();
        {
            let (seen, stop) = (Arc::clone(&seen), Arc::clone(&stop));
            thread::spawn(move || {
                let mut pubsub = conn.as_pubsub();
                match &what {
                    Subscription::Keyspace(pattern) => {
                        pubsub.psubscribe(format!("{KEYSPACE}{pattern}")).unwrap();
                    }
                    Subscription::Channel(channel) => pubsub.subscribe(channel).unwrap(),
                }
                let _ = subscribed_tx.send(());
                while !stop.load(Ordering::SeqCst) {
                    match pubsub.get_message() {
                        Ok(msg) => {
                            let at = Instant::now();
                            let key = msg.get_channel_name().trim_start_matches(KEYSPACE);
                            let event: String = msg.get_payload().unwrap_or_default();
                            seen.lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push(KeyEvent {
                                    at,
                                    key: key.to_owned(),
                                    event,
                                });
                        }
                        // A frozen or idle server: look at the stop flag, then read on.
                        Err(e) if e.is_timeout() => {}
                        // The server is gone.
                        Err(_) => break,
                    }
                }
            });
        }
        subscribed
            .recv_timeout(SUBSCRIBE_TIMEOUT)
            .expect("the subscription did not start");
        KeyEvents { seen, stop }
    }

    /// Every event of `key` so far, in order.
    pub fn of(&self, key: &str) -> Vec<KeyEvent> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|e| e.key == key)
            .cloned()
            .collect()
    }

    /// The first event of `key` among `events` that arrived at `after` or later.
    pub fn first_after(&self, key: &str, events: &[&str], after: Instant) -> Option<KeyEvent> {
        self.of(key)
            .into_iter()
            .find(|e| e.at >= after && events.contains(&e.event.as_str()))
    }

    /// [`first_after`](Self::first_after), waiting for it (on the tokio timer) up to `timeout`;
    /// panics naming `what`, with every event of `key`, if none comes.
    pub async fn wait_first_after(
        &self,
        key: &str,
        events: &[&str],
        after: Instant,
        timeout: Duration,
        what: &str,
    ) -> KeyEvent {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = self.first_after(key, events, after) {
                return found;
            }
            let now = Instant::now();
            assert!(
                now < deadline,
                "{what}: no {events:?} event of {key} within {timeout:?}; its events: {:?}",
                self.of(key)
                    .iter()
                    .map(|e| (e.event.as_str(), e.at.saturating_duration_since(after)))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(POLL.min(deadline - now)).await;
        }
    }

    /// A late request's grant and its cleanup: waits up to `land_within` for a `set` of `key`
    /// arriving at `after` or later (the proof that the late request reached Redis), then for
    /// the key's removal, and panics naming `what` unless that removal was a `del` (a release,
    /// not the ttl) within `bound` of the landing. Returns how long after `after` the grant
    /// landed, and how long it lived.
    pub async fn late_grant_released(
        &self,
        key: &str,
        after: Instant,
        land_within: Duration,
        bound: Duration,
        what: &str,
    ) -> (Duration, Duration) {
        let landed = self
            .wait_first_after(key, &["set"], after, land_within, what)
            .await;
        let removed = self
            .wait_first_after(
                key,
                &["del", "expired", "evicted"],
                landed.at,
                bound + bound / 2,
                &format!("{what}: the late grant's removal"),
            )
            .await;
        let lived = removed.at - landed.at;
        assert_eq!(
            removed.event, "del",
            "{what}: the late grant was not released"
        );
        assert!(
            lived <= bound,
            "{what}: the late grant lived {lived:?}, past the bound {bound:?}"
        );
        (landed.at - after, lived)
    }
}

impl Drop for KeyEvents {
    fn drop(&mut self) {
        // The thread sees it within one read timeout; not joined, so a frozen server cannot
        // hold up the test's end.
        self.stop.store(true, Ordering::SeqCst);
    }
}
