//! A lock that is free while someone waits must be announced, also where two mechanisms meet: a
//! release whose answer was lost (the server's own compare-and-delete, whose wake-up follows its
//! answer; a Redlock node's part, which is not waited for once a majority confirmed), and a grant
//! given back because its caller gave up on it. Each test marks the lock waited for as a refused
//! waiter does (`SET waiting 1 PX ..`) and listens on its release channel, so what it checks is
//! the wake-up itself, not a real waiter's poll, which would find the lock free sooner or later
//! anyway and make a missing wake-up pass for a delivered one. Rows of `lock-runtime/FAULTS.md`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::layout::redlock_gate;
use lock_runtime::{LockClient, LockConfig, LockError};
use lock_tests::{
    FaultProxy, KeyEvents, QUICK_REQUEST, RedisMasters, RedisServer, SCHEDULING_SLACK,
    ServerOptions, bounded, key_exists, lock_keys, ms, quick_client, unique_key, warm_up,
};

/// How long the test's mark says someone waits: longer than any test here.
const MARK: Duration = Duration::from_secs(20);
/// The ttl of the locks: a copy left behind would outlive every bound here by far.
const TTL: Duration = Duration::from_secs(30);
/// The first pause of a Redlock release part's retry (`RELEASE_RETRIES_FOR`'s loop).
const PART_RETRY: Duration = Duration::from_millis(50);

/// A Valkey server (its `DELIFEQ` is the native release), or `None`: the Valkey tests are
/// skipped (see `lock_tests::valkey_server`).
fn valkey() -> Option<ServerOptions> {
    Some(ServerOptions {
        binary: Some(lock_tests::valkey_server()?),
        ..ServerOptions::default()
    })
}

/// Marks lock `key` on `server` waited for, as a refused waiter does, and listens on its release
/// channel there.
fn waited_for(server: &RedisServer, key: &str) -> KeyEvents {
    let keys = lock_keys(key);
    let () = redis::cmd("SET")
        .arg(&keys.waiting)
        .arg("1")
        .arg("PX")
        .arg(MARK.as_millis() as u64)
        .query(&mut server.admin())
        .unwrap();
    KeyEvents::published(server, &keys.channel)
}

/// Waits up to `bound` from `since` for a wake-up (an empty message) on `key`'s release channel.
async fn woken(published: &KeyEvents, key: &str, since: Instant, bound: Duration, what: &str) {
    let channel = lock_keys(key).channel;
    let left = bound.saturating_sub(since.elapsed());
    let heard = published
        .wait_first_after(&channel, &[""], since, left, what)
        .await;
    eprintln!(
        "{what}: woken {:?} after (bound {bound:?})",
        heard.at - since
    );
}

/// Acquires `key` on `locks` while its replies are lost (the caller cut them): the call must
/// answer `Unavailable`, and its grant must have landed where `events` watches the lock (a `set`
/// after the call began: the premise of a grant given back). Returns when the call answered.
async fn gave_up_on_a_landed_grant(locks: &LockClient, key: &str, events: &KeyEvents) -> Instant {
    let asked = Instant::now();
    let result = bounded(
        Duration::from_secs(5),
        "acquire",
        locks.lock(key).ttl(TTL).acquire(),
    )
    .await;
    let failed = Instant::now();
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    let lock = lock_keys(key).lock;
    events
        .wait_first_after(&lock, &["set"], asked, SCHEDULING_SLACK, "the grant")
        .await;
    failed
}

/// Valkey, one node: the release is `DELIFEQ` and `EXISTS` on the flag, and the wake-up a second
/// round trip once that answer says someone waits. Replies lost from the release on (requests
/// still delivered): the `DELIFEQ` deletes the lock, its answer never comes, and the call answers
/// `Unavailable`. Before, the release's retry went by script, found the lock free and nobody
/// woken, and did nothing: the waiters slept to their next poll (0.5-1.9 s measured) while the
/// lock was free. The retry's script now wakes them when it finds the lock free and marked, and
/// its request goes through the half-open link: the wake-up comes within the release's request
/// timeout and one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_release_whose_answer_was_lost_still_wakes_the_waiters() {
    let Some(valkey) = valkey() else { return };
    let server = RedisServer::start_with(valkey);
    let proxy = FaultProxy::start(server.port());
    let holder = quick_client(proxy.url());
    warm_up(&holder).await;
    let key = unique_key("wake:native-lost-answer");
    let guard = holder.lock(&key).ttl(TTL).acquire().await.unwrap();
    let published = waited_for(&server, &key);
    let native_before = server.command_calls("delifeq");
    proxy.set_blackhole_down(true);
    let released = Instant::now();
    let outcome = bounded(Duration::from_secs(5), "release", guard.release()).await;
    assert!(
        matches!(outcome, Err(LockError::Unavailable { .. })),
        "the release's answer was lost, yet: {outcome:?}"
    );
    // The premise: the server's own delete ran (the lock is gone) and nothing else freed it.
    assert!(
        server.command_calls("delifeq") > native_before,
        "the release did not use DELIFEQ: this test proves nothing on this server"
    );
    assert!(
        !key_exists(&server, &lock_keys(&key).lock),
        "the release never reached the server"
    );
    let bound = QUICK_REQUEST + SCHEDULING_SLACK;
    woken(
        &published,
        &key,
        released,
        bound,
        "native release, answer lost",
    )
    .await;
}

/// Redlock over three Valkey masters: the release's part on the lock's gate (where waiters
/// listen) loses its answer; the other two confirm, and the call returns `Ok`. Before, a part was
/// never sent again once a majority confirmed: the gate's `DELIFEQ` had deleted the lock there
/// and nobody was woken. The part is now sent again (by script) after its timeout and a 50 ms
/// pause, through the half-open link, and wakes the gate's waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_release_whose_answer_the_gate_lost_still_wakes_the_waiters() {
    let Some(valkey) = valkey() else { return };
    let masters = RedisMasters::start_with(3, &valkey);
    let key = unique_key("wake:gate-lost-answer");
    let gate = redlock_gate(&key, 3);
    let gate_node = &masters.nodes[gate];
    let proxy = FaultProxy::start(gate_node.port());
    let mut urls = masters.urls();
    urls[gate] = proxy.url();
    let holder = LockClient::new(
        LockConfig::redlock(urls)
            .connect_timeout(ms(200))
            .response_timeout(ms(200)),
    )
    .unwrap();
    // The client learns which commands a node has with its first release there, in the
    // background of that release (a Redlock release returns at its majority): warmed up until a
    // release on the gate is its own compare-and-delete.
    for _ in 0..10 {
        let warmed = warm_up(&holder).await;
        // Its release returned at its majority: the count below is taken once its part on the
        // gate ran too (a late warm-up DELIFEQ once passed for the test's own).
        lock_tests::wait_until_async(QUICK_REQUEST, "the warm-up released on the gate", || {
            !key_exists(gate_node, &lock_keys(&warmed).lock)
        })
        .await;
        if gate_node.command_calls("delifeq") > 0 {
            break;
        }
    }
    assert!(
        gate_node.command_calls("delifeq") > 0,
        "ten releases, none by DELIFEQ on the gate"
    );
    let guard = holder.lock(&key).ttl(TTL).acquire().await.unwrap();
    lock_tests::wait_until_async(Duration::from_secs(2), "the lock on the gate", || {
        key_exists(gate_node, &lock_keys(&key).lock)
    })
    .await;
    let published = waited_for(gate_node, &key);
    let native_before = gate_node.command_calls("delifeq");
    proxy.set_blackhole_down(true);
    let released = Instant::now();
    bounded(Duration::from_secs(5), "release", guard.release())
        .await
        .expect("a majority confirmed the release");
    lock_tests::wait_until_async(QUICK_REQUEST, "the gate's DELIFEQ", || {
        gate_node.command_calls("delifeq") > native_before
    })
    .await;
    assert!(
        !key_exists(gate_node, &lock_keys(&key).lock),
        "the release's part never reached the gate"
    );
    let bound = QUICK_REQUEST + PART_RETRY + SCHEDULING_SLACK;
    woken(
        &published,
        &key,
        released,
        bound,
        "redlock gate, answer lost",
    )
    .await;
}

/// One Redis node, replies lost: the acquire lands but its caller never hears of it, answers
/// `Unavailable`, and its cleanup gives the grant back through the half-open link. That grant was
/// a real key: a waiter refused by it marked the lock and sleeps on the strength of its holder's
/// announcement. Before, the cleanup withdrew it quietly (deleted, nobody told); it now releases
/// it as a holder would, waking the waiters, within one request of the call's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_its_caller_gave_up_on_wakes_the_waiters_when_given_back() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = quick_client(proxy.url());
    warm_up(&locks).await;
    let key = unique_key("wake:given-back");
    let lock = lock_keys(&key).lock;
    let events = KeyEvents::watch(&server, &lock);
    let published = waited_for(&server, &key);
    proxy.set_blackhole_down(true);
    let failed = gave_up_on_a_landed_grant(&locks, &key, &events).await;
    let bound = QUICK_REQUEST + SCHEDULING_SLACK;
    woken(&published, &key, failed, bound, "a grant given back").await;
    assert!(!key_exists(&server, &lock), "the grant was not given back");
}

/// Redlock over three Redis masters, replies lost from every node: the attempt lands on each, its
/// caller answers `Unavailable`, and each node's grant is withdrawn through the half-open links.
/// Before, the withdrawal of an attempt whose answer was lost (the node's part) and the caller's
/// cleanup were both quiet; a waiter refused by those grants slept to its next poll. Now each
/// node's withdrawal is told as a release: the gate announces it within one request of the
/// call's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_attempt_whose_answers_were_lost_wakes_the_waiters_when_withdrawn() {
    let masters = RedisMasters::start(3);
    let proxies: Vec<FaultProxy> = masters
        .nodes
        .iter()
        .map(|n| FaultProxy::start(n.port()))
        .collect();
    let locks = LockClient::new(
        LockConfig::redlock(proxies.iter().map(FaultProxy::url))
            .connect_timeout(ms(200))
            .response_timeout(ms(200)),
    )
    .unwrap();
    warm_up(&locks).await;
    let key = unique_key("wake:redlock-withdrawn");
    let gate_node = &masters.nodes[redlock_gate(&key, 3)];
    let lock = lock_keys(&key).lock;
    let events = KeyEvents::watch(gate_node, &lock);
    let published = waited_for(gate_node, &key);
    for proxy in &proxies {
        proxy.set_blackhole_down(true);
    }
    let failed = gave_up_on_a_landed_grant(&locks, &key, &events).await;
    let bound = QUICK_REQUEST + SCHEDULING_SLACK;
    woken(&published, &key, failed, bound, "a Redlock grant withdrawn").await;
    assert!(!key_exists(gate_node, &lock), "the grant was not withdrawn");
}
