//! Fencing tokens on one Redis node when the fence counter (one per server) is lost (deleted,
//! evicted by `allkeys-lru`, gone with a restart without persistence, recreated by refused
//! attempts) or not a number, and across same-token retries: every grant that asks for a token
//! carries one, larger than every token of its key before, or is refused. What a token costs,
//! and that no key of a lock outlives it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{FailureKind, LockConfig, LockError};
use lock_tests::{
    FaultProxy, KeyEvents, RedisServer, SCHEDULING_SLACK, bounded, client, eventually, key_exists,
    lock_keys, ms, unique_key, warm_up,
};

/// Deletes the fence counter of `key`, as an eviction or a restart without data would.
fn forget_fence(server: &RedisServer, key: &str) {
    let _: i64 = redis::cmd("DEL")
        .arg(lock_keys(key).fence)
        .query(&mut server.admin())
        .unwrap();
}

#[tokio::test]
async fn fencing_tokens_grow_after_the_counter_is_deleted() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()).fencing(true));
    let key = unique_key("life:fence-deleted");
    let mut last = 0;
    for round in 0..4 {
        let guard = locks.lock(&key).acquire().await.unwrap();
        let token = guard
            .fencing_token()
            .expect("a grant without a fencing token");
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        guard.release().await.unwrap();
        forget_fence(&server, &key);
    }
}

/// Without a fence (the default) nothing ties a grant to a counter: a plain lock is asked for
/// with `SET NX PX GET` alone, no script, and a second client that does not wait is refused by
/// its `SET` alone (no `PTTL`: it has no wait to bound) while it is held.
#[tokio::test]
async fn without_a_fence_a_lock_is_asked_for_with_set_alone() {
    let server = RedisServer::start();
    let [holder, other] = [(); 2].map(|()| client(LockConfig::single(server.url()).fencing(false)));
    let key = unique_key("life:unfenced");
    let calls = || {
        let stats = server.stats();
        ["multi", "evalsha", "set", "pttl"].map(|command| stats.command(command, "calls"))
    };
    let before = calls();
    let guard = holder.lock(&key).acquire().await.unwrap();
    assert_eq!(guard.fencing_token(), None);
    assert!(key_exists(&server, &lock_keys(&key).lock), "not granted");
    match other.lock(&key).acquire().await {
        Err(LockError::Contended { .. }) => {}
        refused => panic!("a second client got {refused:?} while the lock was held"),
    }
    let after = calls();
    let asked: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    assert_eq!(
        asked,
        [0, 0, 2, 0],
        "MULTI, EVALSHA, SET, PTTL for a grant and a refusal"
    );
    guard.release().await.unwrap();
    assert!(!key_exists(&server, &lock_keys(&key).lock), "not released");
}

/// A fenced grant of one key is one script call of `SET NX PX GET`, `INCR` and `TIME` (and a
/// `SET` raising the counter to the clock, here once: the counter starts missing); every name
/// counts on the server's one counter, whose last count is the last token.
#[tokio::test]
async fn a_fenced_grant_costs_one_call_on_the_servers_one_counter() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()).fencing(true));
    warm_up(&locks).await;
    let stats = server.stats();
    let mut last = 0;
    for i in 0..10 {
        let guard = locks
            .lock(unique_key(&format!("life:fence-cost{i}")))
            .acquire();
        let guard = guard.await.unwrap();
        let token = guard.fencing_token().unwrap();
        assert!(token > last, "name {i}: token {token} after {last}");
        last = token;
        let counter: u64 = redis::cmd("GET")
            .arg(lock_keys("any").fence)
            .query(&mut server.admin())
            .unwrap();
        assert_eq!(counter, token, "the server's counter is not the last token");
        guard.release().await.unwrap();
    }
    let after = server.stats();
    let grants = |command: &str| after.command(command, "calls") - stats.command(command, "calls");
    assert_eq!(grants("incr"), 10, "one count per grant");
    assert_eq!(grants("time"), 10, "one clock reading per grant");
    assert!(
        grants("set") <= 10 + 1,
        "SET NX per grant, at most one raise"
    );
    assert_eq!(grants("multi"), 0, "no transaction");
}

/// A fenced attempt counts the fence on before it asks for the lock, even when it is refused.
/// With the counter lost, refused attempts leave a small count behind, and the next grant must
/// still raise it to the clock.
#[tokio::test]
async fn refused_attempts_leave_no_counter_below_the_clock_behind() {
    let server = RedisServer::start();
    let [a, b, c] = [(); 3].map(|()| client(LockConfig::single(server.url()).fencing(true)));
    let key = unique_key("life:fence-refused");
    let held = b.lock(&key).acquire().await.unwrap();
    let before = held.fencing_token().unwrap();
    forget_fence(&server, &key);
    for _ in 0..3 {
        let refused = a.lock(&key).acquire().await;
        assert!(
            refused.as_ref().is_err_and(LockError::is_contended),
            "{refused:?}"
        );
    }
    let count: i64 = redis::cmd("GET")
        .arg(lock_keys(&key).fence)
        .query(&mut server.admin())
        .unwrap();
    assert_eq!(
        count, 3,
        "the refused attempts counted the lost counter on from 0"
    );
    held.release().await.unwrap();
    let guard = c.lock(&key).acquire().await.unwrap();
    let token = guard.fencing_token().unwrap();
    guard.release().await.unwrap();
    assert!(token > before, "token {token} not above {before}");
}

/// A fair lock handed to its waiter by the holder's release: the waiter that wants a token asks
/// the server for it, which counts it on by the rule of every grant. With the counter lost and
/// recreated meanwhile by the `INCR`s of refused attempts (written here as those `INCR`s), a
/// hand-off that announced that small count gave the waiter a token far below the holder's.
#[tokio::test]
async fn a_fair_hand_off_after_the_counter_was_recreated_has_a_larger_token() {
    let server = RedisServer::start();
    let [a, b] = [(); 2].map(|()| client(LockConfig::single(server.url()).fencing(true)));
    let key = unique_key("life:fence-hand-off");
    let held = a.lock(&key).fair(true).acquire().await.unwrap();
    let before = held.fencing_token().unwrap();
    let waiting = {
        let lock = b.lock(&key).fair(true).wait(Duration::from_secs(10));
        tokio::spawn(async move { lock.acquire().await })
    };
    lock_tests::until_queued(&a, &key, 1).await;
    forget_fence(&server, &key);
    for _ in 0..3 {
        let _: i64 = redis::cmd("INCR")
            .arg(lock_keys(&key).fence)
            .query(&mut server.admin())
            .unwrap();
    }
    let publishes = server.command_calls("publish");
    held.release().await.unwrap();
    let got = bounded(Duration::from_secs(5), "the hand-off", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        server.command_calls("publish") > publishes,
        "the lock was not handed off"
    );
    let token = got.fencing_token().unwrap();
    got.release().await.unwrap();
    assert!(token > before, "hand-off token {token} not above {before}");
}

/// A fence counter that is not a number gives no fencing token, so no lock: the acquire fails as
/// unavailable and leaves no lock behind (the count comes before the lock is written); once the
/// counter is gone the name works again.
#[tokio::test]
async fn a_fence_counter_that_is_not_a_number_grants_nothing() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()).fencing(true));
    let key = unique_key("life:fence-garbage");
    let guard = locks.lock(&key).acquire().await.unwrap();
    guard.release().await.unwrap();
    let () = redis::cmd("SET")
        .arg(lock_keys(&key).fence)
        .arg("not a number")
        .query(&mut server.admin())
        .unwrap();
    match locks.lock(&key).acquire().await {
        Err(LockError::Unavailable { causes, .. }) => {
            assert_eq!(causes[0].kind, FailureKind::Response, "{causes:?}");
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    assert!(
        !key_exists(&server, &lock_keys(&key).lock),
        "a lock without a fence was left behind"
    );
    forget_fence(&server, &key);
    let guard = locks.lock(&key).acquire().await.unwrap();
    assert!(guard.fencing_token().is_some());
    guard.release().await.unwrap();
}

/// The first attempt lands late (its reply times out), the counter is evicted, and the retry with
/// the same token answers "ours": that grant must still carry a token, larger than the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_token_retry_after_the_counter_is_gone_still_has_a_token() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = client(
        LockConfig::single(proxy.url())
            .fencing(true)
            .response_timeout(ms(200)),
    );
    let key = unique_key("life:fence-retry");
    let before = {
        let guard = locks.lock(&key).acquire().await.unwrap();
        let token = guard.fencing_token().unwrap();
        guard.release().await.unwrap();
        token
    };
    proxy.set_delay(ms(400));
    let task = {
        let locks = locks.clone();
        let key = key.clone();
        tokio::spawn(async move {
            locks
                .lock(&key)
                .wait(Duration::from_secs(5))
                .acquire()
                .await
        })
    };
    let landed = eventually(Duration::from_secs(5), || {
        key_exists(&server, &lock_keys(&key).lock)
    })
    .await;
    assert!(landed, "the first attempt never reached the server");
    forget_fence(&server, &key);
    proxy.set_delay(Duration::ZERO);
    let guard = bounded(Duration::from_secs(15), "acquire", task)
        .await
        .unwrap()
        .unwrap();
    eprintln!(
        "same-token retry after the counter vanished: token {:?}",
        guard.fencing_token().map(|t| t > before)
    );
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    let token = token.expect("a grant (same-token retry) without a fencing token");
    assert!(token > before, "token {token} not above {before}");
}

#[tokio::test]
async fn fencing_tokens_grow_when_allkeys_lru_evicts_the_counter() {
    let server = RedisServer::start();
    let mut admin = server.admin();
    let locks = client(LockConfig::single(server.url()).fencing(true));
    let key = unique_key("life:fence-lru");
    let used: String = redis::cmd("INFO").arg("memory").query(&mut admin).unwrap();
    let used: u64 = used
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    for (name, value) in [
        ("maxmemory", (used + 2 * 1024 * 1024).to_string()),
        ("maxmemory-policy", "allkeys-lru".to_owned()),
    ] {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut admin)
            .unwrap();
    }
    let mut last = 0;
    let mut evictions = 0;
    let mut junk = 0u64;
    for round in 0..3 {
        let guard = locks.lock(&key).acquire().await.unwrap();
        let token = guard
            .fencing_token()
            .expect("a grant without a fencing token");
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        guard.release().await.unwrap();
        // Junk until the counter is evicted (bounded).
        for _ in 0..200 {
            if !key_exists(&server, &lock_keys(&key).fence) {
                evictions += 1;
                break;
            }
            let mut pipe = redis::pipe();
            for _ in 0..100 {
                junk += 1;
                pipe.cmd("SET")
                    .arg(format!("junk:{junk}"))
                    .arg(vec![b'x'; 1024])
                    .ignore();
            }
            let () = pipe.query(&mut admin).unwrap();
        }
    }
    eprintln!("allkeys-lru: the fence counter was evicted {evictions} time(s)");
    assert!(
        evictions >= 2,
        "the lever failed: the counter was evicted {evictions} time(s)"
    );
}

/// The server's clock in microseconds (`TIME`).
fn server_clock_us(admin: &mut redis::Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(admin).unwrap();
    secs * 1_000_000 + micros
}

/// A same-token retry whose grant comes long after an earlier attempt of the same token landed
/// (its reply lost) gets a token raised to its own grant's server clock, as every grant does (the
/// clock is the floor that keeps tokens growing across what loses a counter): it used to answer
/// the counter as the lost grant left it. The link delays each way by 400 ms with 200 ms
/// timeouts, so the first attempt lands (keyspace `set`) but is never answered; the link heals
/// 1.5 s in, and the retry that succeeds then finds the key ours. Its token is at least the
/// server's clock read right after the acquire returned, less the transaction's lag
/// (`FENCE_LAG_US`, 100 ms) and the slack for that read.
#[tokio::test]
async fn a_same_token_retry_long_after_its_lost_grant_gets_a_token_at_the_clock() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let timeout = Duration::from_millis(200);
    let locks = client(
        LockConfig::single(proxy.url())
            .fencing(true)
            .connect_timeout(timeout)
            .response_timeout(timeout),
    );
    let key = unique_key("faults:same-token");
    let lock = lock_keys(&key).lock;
    warm_up(&locks).await;
    let events = KeyEvents::watch(&server, &lock);
    let mut admin = server.admin();
    let heal_after = Duration::from_millis(1500);
    proxy.set_delay(Duration::from_millis(400));
    let started = Instant::now();
    let (result, ()) = tokio::join!(
        bounded(
            Duration::from_secs(15),
            "acquire with wait through a slow link",
            locks.lock(&key).wait(Duration::from_secs(5)).acquire(),
        ),
        async {
            tokio::time::sleep(heal_after).await;
            proxy.set_delay(Duration::ZERO);
        },
    );
    let guard = result.expect("acquired once the link healed");
    let clock_after = server_clock_us(&mut admin);
    let returned = Instant::now();
    let token = guard.fencing_token().expect("fencing is on");
    // The cause: the same token's grant landed long before the one that was answered.
    let first = events
        .first_after(&lock, &["set"], started)
        .expect("the first attempt's grant landed");
    assert!(
        returned - first.at >= Duration::from_millis(800),
        "the first grant landed {:?} before the acquire returned: too close to show anything",
        returned - first.at
    );
    let floor = clock_after - 100_000 - SCHEDULING_SLACK.as_micros() as u64;
    eprintln!(
        "same-token retry: first grant {:?} after the start, answered {:?}; token {token}, \
         server clock after {clock_after} ({} us apart)",
        first.at - started,
        returned - started,
        clock_after.saturating_sub(token)
    );
    assert!(
        token >= floor,
        "token {token} is {} us below the server's clock right after the grant",
        clock_after.saturating_sub(token)
    );
    guard.release().await.unwrap();
}

/// Redis restarted without persistence loses the fence counter; the next token must still be
/// larger than every token before (the counter restarts from the server clock, not from 1).
#[tokio::test]
async fn fencing_tokens_keep_growing_across_a_restart_without_persistence() {
    let mut server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()).fencing(true));
    let key = unique_key("faults:fence-restart");
    let mut before = 0;
    for _ in 0..3 {
        let guard = locks.lock(&key).acquire().await.unwrap();
        before = guard.fencing_token().unwrap();
        guard.release().await.unwrap();
    }
    server.restart();
    assert!(
        server
            .keys(&format!("{}*", lock_keys(&key).lock))
            .is_empty(),
        "restart kept the data"
    );
    // The client reconnects on its own; retry through the brief reconnection window.
    let guard = locks
        .lock(&key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let after = guard.fencing_token().unwrap();
    eprintln!("fencing token {before} before the restart, {after} after");
    assert!(after > before, "token went back from {before} to {after}");
    guard.release().await.unwrap();
}

/// No key of a lock outlives it: 200 names locked and released, half of them with a fencing
/// token, leave one key behind, the server's fence counter (the per-name counters of before
/// kept 200 keys for an hour).
#[tokio::test]
async fn no_key_of_a_released_lock_stays_but_the_servers_counter() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    for i in 0..200 {
        let guard = locks
            .lock(unique_key(&format!("life:fence-left{i}")))
            .fencing(i % 2 == 0)
            .acquire()
            .await
            .unwrap();
        assert_eq!(guard.fencing_token().is_some(), i % 2 == 0, "name {i}");
        guard.release().await.unwrap();
    }
    assert_eq!(server.keys("*"), [lock_keys("any").fence]);
}
