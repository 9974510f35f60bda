//! Grants that land after their call gave up on them: a reply delayed past the response timeout
//! (the outcome unknown) or past the lock's validity, a stale acquire on a socket that was reset,
//! an acquire cancelled at any point. None is reported as a success, and each grant that lands
//! is released by the call's cleanup within one request timeout (and the cleanup's pause) of
//! landing, not left for its ttl. On one Redis node, through the fault proxy; keyspace events
//! prove when a grant landed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{FailureKind, LockConfig, LockError};
use lock_tests::{
    CLEANUP_PAUSE, FaultProxy, KeyEvents, QUICK_REQUEST, RedisServer, SCHEDULING_SLACK, bounded,
    callers_connection, client, default_validity, key_exists, lock_keys, ms, quick_client,
    unique_key, wait_key_gone, wait_until_async, warm_up,
};

fn exists(admin: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query(admin).unwrap()
}

/// A reply delayed past the response timeout (400 ms each way, timeout 200 ms): the outcome is
/// unknown, so the call says `Unavailable` (a timeout, never `Contended`). The request did reach
/// Redis (a keyspace `set` event after the call returned); the cleanup release, sent when the call
/// failed, follows it down the same link: the grant is deleted within one request timeout of
/// landing (+ slack), not by its 30 s ttl. With a wait, the same token is retried and wins.
/// From a current-thread runtime the calls go over the client's shared connection.
#[tokio::test]
async fn acquire_with_unknown_outcome_leaves_no_orphan() {
    unknown_outcome_leaves_no_orphan(false).await;
}

/// The same from a multi-thread runtime, whose calls go over a connection of its own (made once
/// the shared one is): the cleanup follows the acquire down that connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_with_unknown_outcome_over_the_callers_connection_leaves_no_orphan() {
    unknown_outcome_leaves_no_orphan(true).await;
}

async fn unknown_outcome_leaves_no_orphan(callers_own: bool) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let (connect, response) = (Duration::from_millis(200), Duration::from_millis(200));
    let locks = client(
        LockConfig::single(proxy.url())
            .fencing(true)
            .connect_timeout(connect)
            .response_timeout(response),
    );
    let direct = client(LockConfig::single(server.url()).fencing(true));
    let key = unique_key("faults:unknown");
    let lock = lock_keys(&key).lock;
    let ttl = Duration::from_secs(30);
    // Connect through the proxy first, so only the acquire itself is slow.
    warm_up(&locks).await;
    if callers_own {
        // The shared connection and the runtime's own: nothing else has connected yet.
        callers_connection(&server, &locks).await;
    }
    let events = KeyEvents::watch(&server, &lock);

    proxy.set_delay(Duration::from_millis(400));
    let started = Instant::now();
    let result = bounded(
        Duration::from_secs(10),
        "acquire through a slow link",
        locks.lock(&key).ttl(ttl).acquire(),
    )
    .await;
    let returned = Instant::now();
    match result {
        Err(LockError::Unavailable { causes, .. }) => {
            eprintln!("slow link: unavailable after {:?}", returned - started);
            assert!(
                causes.iter().all(|c| c.kind == FailureKind::Timeout),
                "{causes:?}"
            );
        }
        other => panic!(
            "a reply 800 ms away with a 200 ms timeout: expected Unavailable (never Contended: \
             the only holder is ourselves), got {other:?}"
        ),
    }
    // The server did get the SET (it was only slow, 400 ms away); the cleanup
    // release, sent at most one request timeout after the acquire, trails it by no more than
    // that on the same delayed link.
    let bound = connect + response + SCHEDULING_SLACK;
    let (landed, lived) = events
        .late_grant_released(
            &lock,
            started,
            Duration::from_secs(2),
            bound,
            "the slow acquire",
        )
        .await;
    eprintln!(
        "slow link: the grant landed {landed:?} after the acquire started, released {lived:?} \
         later (bound {bound:?}, ttl {ttl:?})"
    );
    let mut admin = server.admin();
    assert!(!exists(&mut admin, &lock), "{:?}", events.of(&lock));
    let guard = bounded(
        Duration::from_secs(5),
        "second client",
        direct.lock(&key).ttl(ttl).acquire(),
    )
    .await
    .expect("a second client can take the lock once the uncertain one is gone");
    guard.release().await.unwrap();

    // With a wait, the same token is retried until the link is fast again: the acquire succeeds.
    proxy.set_delay(Duration::from_millis(400));
    let started = Instant::now();
    let (result, ()) = tokio::join!(
        bounded(
            Duration::from_secs(15),
            "acquire with wait through a slow link",
            locks
                .lock(&key)
                .ttl(ttl)
                .wait(Duration::from_secs(3))
                .acquire(),
        ),
        async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            proxy.set_delay(Duration::ZERO);
        },
    );
    let guard = result.expect("acquire retried after the link recovered");
    eprintln!(
        "slow link healed after 500ms: acquired after {:?}",
        started.elapsed()
    );
    assert!(guard.fencing_token().is_some());
    assert!(exists(&mut admin, &lock_keys(&key).lock));
    bounded(Duration::from_secs(5), "release", guard.release())
        .await
        .expect("release");
    assert!(!exists(&mut admin, &lock_keys(&key).lock));
}

/// A reply delayed past the lock's validity is never a success, on a single node: a proxy adds
/// 200 ms each way, so every round trip (400 ms) outlasts the 300 ms ttl. With a patient client
/// (3 s timeouts: the reply comes within them) and an impatient one (200 ms: it times out),
/// wait 0 and 1 s: `Unavailable`. The request did land (keyspace `set`, one link delay in), and
/// once the delay is gone nothing is left within the ttl + slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_past_validity_is_never_success_on_a_single_node() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let timeouts = |t: Duration| {
        client(
            LockConfig::single(proxy.url())
                .fencing(true)
                .connect_timeout(t)
                .response_timeout(t),
        )
    };
    let (patient, impatient) = (
        timeouts(Duration::from_secs(3)),
        timeouts(Duration::from_millis(200)),
    );
    let key = unique_key("faults:past-validity");
    let lock = lock_keys(&key).lock;
    let ttl = Duration::from_millis(300);
    let one_way = Duration::from_millis(200);
    assert!(2 * one_way > default_validity(ttl));
    let events = KeyEvents::watch(&server, &lock);
    for (name, locks) in [("patient", &patient), ("impatient", &impatient)] {
        warm_up(locks).await;
        proxy.set_delay(one_way);
        for wait in [Duration::ZERO, Duration::from_secs(1)] {
            let what = format!("{name} client, wait {wait:?}");
            let started = Instant::now();
            let result = bounded(
                Duration::from_secs(10),
                &what,
                locks.lock(&key).ttl(ttl).wait(wait).acquire(),
            )
            .await;
            eprintln!(
                "single node +400ms RTT, ttl {ttl:?}, {what}: {} after {:?}",
                match &result {
                    Ok(_) => "Ok".to_owned(),
                    Err(e) => e.to_string(),
                },
                started.elapsed()
            );
            assert!(
                matches!(result, Err(LockError::Unavailable { .. })),
                "{what}: a reply past the validity: expected Unavailable, got {:?}",
                result.map(drop)
            );
            let landed = events
                .wait_first_after(&lock, &["set"], started, Duration::from_secs(2), &what)
                .await;
            assert!(
                landed.at >= started + one_way,
                "{what}: the grant landed {:?} in, not delayed",
                landed.at - started
            );
        }
        proxy.set_delay(Duration::ZERO);
        let mut admin = server.admin();
        wait_key_gone(&server, &lock, ttl + SCHEDULING_SLACK, name).await;
        assert!(!exists(&mut admin, &lock));
    }
}

/// The server is frozen while an acquire is in flight (its bytes wait in the server's socket
/// buffer); the connection is then reset, so the client reconnects for its cleanup release. After
/// the thaw, the stale acquire still runs (a keyspace `set` event after the thaw proves it): its
/// grant must be deleted by the cleanup within one cleanup retry pause (at most 1 s, the engine's
/// backoff) + one request timeout of landing, not outlive the failed call for its 30 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_acquire_after_a_reconnect_leaves_no_orphan() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let (connect, response) = (ms(200), ms(200));
    let locks = client(
        LockConfig::single(proxy.url())
            .fencing(true)
            .connect_timeout(connect)
            .response_timeout(response),
    );
    let key = unique_key("life:stale-acquire");
    let lock = lock_keys(&key).lock;
    let ttl = Duration::from_secs(30);
    warm_up(&locks).await;
    let events = KeyEvents::watch(&server, &lock);
    server.freeze();
    let task = {
        let locks = locks.clone();
        let key = key.clone();
        tokio::spawn(async move {
            locks
                .lock(&key)
                .ttl(ttl)
                .wait(Duration::from_secs(1))
                .acquire()
                .await
        })
    };
    // The scenario: attempts are queued in the frozen server's buffer; then the link resets.
    tokio::time::sleep(ms(500)).await;
    proxy.cut_all();
    let result = bounded(Duration::from_secs(10), "acquire", task)
        .await
        .unwrap();
    eprintln!("acquire against a frozen server, link reset: {result:?}");
    assert!(result.is_err(), "acquired on a frozen server");
    // The server stays frozen a while longer (the cleanup release meets it too).
    tokio::time::sleep(ms(500)).await;
    // Nothing the frozen server runs can come before this instant.
    let thawed = Instant::now();
    server.thaw();
    let bound = CLEANUP_PAUSE + connect + response + SCHEDULING_SLACK;
    let (landed, lived) = events
        .late_grant_released(
            &lock,
            thawed,
            Duration::from_secs(2),
            bound,
            "the stale acquire after the thaw",
        )
        .await;
    eprintln!(
        "after the thaw: the stale grant landed {landed:?} later, released {lived:?} after \
         (bound {bound:?}, ttl {ttl:?})"
    );
    assert!(
        !key_exists(&server, &lock),
        "granted again after the cleanup: {:?}",
        events.of(&lock)
    );
}

/// An acquire cancelled after 0..40 ms, with a 10 ms link each way (a round trip of ~20 ms, on a
/// connection made beforehand): the cancellation lands at every stage, before the request left,
/// while it travels, while the reply does, and after, so some grants
/// reaches Redis once nobody waits for it any more (keyspace `set` events prove it, and the test
/// requires such late grants). Each grant must be released within one request timeout (+ slack)
/// of landing or of the cancellation, whichever is later: a leak would live for the 30 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_cancelled_at_any_point_leaves_nothing() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = quick_client(proxy.url());
    let ttl = Duration::from_secs(30);
    let events = KeyEvents::watch(&server, "*");
    warm_up(&locks).await;
    proxy.set_delay(ms(10));
    let mut cancelled = Vec::new();
    for after in 0..40 {
        let key = unique_key("table:cancel");
        let attempt = tokio::time::timeout(ms(after), locks.lock(&key).ttl(ttl).acquire()).await;
        if let Ok(guard) = attempt {
            guard.unwrap().release().await.unwrap();
            continue;
        }
        cancelled.push((after, lock_keys(&key).lock, Instant::now()));
    }
    let bound = QUICK_REQUEST + SCHEDULING_SLACK;
    let (mut late, mut early, mut unsent) = (0, 0, 0);
    for (after, lock, at) in &cancelled {
        // Anything sent before the cancellation has landed by now, or lands within a link delay.
        wait_until_async(
            bound,
            &format!("cancelled after {after}ms: {lock} gone"),
            || !key_exists(&server, lock),
        )
        .await;
        let Some(landed) = events.first_after(lock, &["set"], *at - Duration::from_secs(60)) else {
            unsent += 1;
            continue;
        };
        let removed = events
            .first_after(lock, &["del", "expired", "evicted"], landed.at)
            .unwrap_or_else(|| panic!("cancelled after {after}ms: {:?}", events.of(lock)));
        let from = landed.at.max(*at);
        let lived = removed.at.saturating_duration_since(from);
        if landed.at > *at {
            late += 1;
        } else {
            early += 1;
        }
        assert_eq!(
            removed.event, "del",
            "cancelled after {after}ms: the grant was not released"
        );
        assert!(
            lived <= bound,
            "cancelled after {after}ms: a grant outlived the call by {lived:?} (bound {bound:?}, \
             ttl {ttl:?})"
        );
    }
    eprintln!(
        "{} of 40 acquires cancelled: {late} granted after the cancellation, {early} granted \
         before it (reply unseen), {unsent} never reached Redis",
        cancelled.len()
    );
    assert!(
        late > 0,
        "no grant landed after its call was cancelled: the lever missed"
    );
}
