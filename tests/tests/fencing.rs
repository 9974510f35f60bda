//! Fencing tokens on one Redis node when the fence counter is lost (deleted, evicted by
//! `allkeys-lru`, gone with a restart without persistence, recreated by refused transactions) or
//! not a number, and across same-token retries: every grant carries a token, larger than every
//! token before, or is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{FailureKind, LockConfig, LockError};
use lock_tests::{
    FENCE_LAG, FaultProxy, KeyEvents, RedisServer, SCHEDULING_SLACK, bounded, client, eventually,
    key_exists, lock_keys, ms, unique_key, warm_up,
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
    let locks = client(LockConfig::single(server.url()));
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
    // Every round took the transaction, whose `INCR` found no counter, and raised the token to
    // the clock: round 1 as a name new to a client that had no clock reading to seed it from yet.
    assert_eq!(server.command_calls("multi"), 4);
}

/// Without a fence (`fencing(false)`, and Redlock's default) nothing ties a grant to a counter:
/// a plain lock is asked for with `SET NX PX GET` and `PTTL` alone, no transaction and no
/// script, and a second client is still refused while it is held.
#[tokio::test]
async fn without_a_fence_a_lock_is_asked_for_without_a_transaction() {
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
        [0, 0, 2, 2],
        "MULTI, EVALSHA, SET, PTTL for a grant and a refusal"
    );
    guard.release().await.unwrap();
    assert!(!key_exists(&server, &lock_keys(&key).lock), "not released");
}

/// A name new to a client that has read the server's clock (on another name) is taken in one
/// transaction that seeds its counter at that clock: no script, and a token above every token
/// the name had before its counter was lost.
#[tokio::test]
async fn a_name_new_to_the_client_is_seeded_in_one_transaction() {
    let server = RedisServer::start();
    let [before, after] = [(); 2].map(|()| client(LockConfig::single(server.url())));
    let key = unique_key("life:fence-seeded");
    let guard = before.lock(&key).acquire().await.unwrap();
    let earlier = guard.fencing_token().unwrap();
    guard.release().await.unwrap();
    forget_fence(&server, &key);
    let reading = after
        .lock(unique_key("life:fence-clock"))
        .acquire()
        .await
        .unwrap();
    reading.release().await.unwrap();
    let (scripts, transactions) = (
        server.command_calls("evalsha"),
        server.command_calls("multi"),
    );
    let guard = after.lock(&key).acquire().await.unwrap();
    let token = guard.fencing_token().unwrap();
    assert_eq!(
        (
            server.command_calls("evalsha") - scripts,
            server.command_calls("multi") - transactions
        ),
        (0, 1),
        "not one transaction alone"
    );
    assert!(token > earlier, "token {token} not above {earlier}");
    let counter: u64 = redis::cmd("GET")
        .arg(lock_keys(&key).fence)
        .query(&mut server.admin())
        .unwrap();
    assert_eq!(counter, token, "the counter is not the token");
    guard.release().await.unwrap();
}

/// A plain lock's attempt is a transaction that counts the fence on even when it is refused the
/// lock. With the counter lost, refused attempts leave a small count behind, and the next grant
/// (here by a client new to the name, with no clock reading to seed it from: its transaction
/// finds the small count) must still raise it to the clock.
#[tokio::test]
async fn refused_transactions_leave_no_unseeded_counter_behind() {
    let server = RedisServer::start();
    let [a, b, c] = [(); 3].map(|()| client(LockConfig::single(server.url())));
    let key = unique_key("life:fence-refused");
    // `a` learns that the name has a counter, so its next attempts take the transaction.
    let guard = a.lock(&key).acquire().await.unwrap();
    guard.release().await.unwrap();
    let held = b.lock(&key).acquire().await.unwrap();
    let before = held.fencing_token().unwrap();
    forget_fence(&server, &key);
    let transactions = server.command_calls("multi");
    for _ in 0..3 {
        let refused = a.lock(&key).acquire().await;
        assert!(
            refused.as_ref().is_err_and(LockError::is_contended),
            "{refused:?}"
        );
    }
    assert_eq!(
        server.command_calls("multi") - transactions,
        3,
        "a's attempts were transactions"
    );
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

/// A fair lock handed to its waiter by the holder's release counts the fence on by the rule of
/// every grant. With the counter lost and recreated meanwhile by the `INCR`s of refused
/// transactions (written here as those `INCR`s), the hand-off announced that small count, and
/// the waiter took it without asking: a token far below the holder's.
#[tokio::test]
async fn a_fair_hand_off_after_the_counter_was_recreated_has_a_larger_token() {
    let server = RedisServer::start();
    let [a, b] = [(); 2].map(|()| client(LockConfig::single(server.url())));
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

/// A fence counter that is not a number gives no fencing token, so no lock: on each path, the
/// transaction that counts on (a client that took the name a moment ago), the one that seeds (a
/// client new to the name that has read the clock) and the script (a client that took the name
/// longer than the fence lag ago), the acquire fails as unavailable and leaves no lock behind;
/// once the counter is gone the name works again.
#[tokio::test]
async fn a_fence_counter_that_is_not_a_number_grants_nothing() {
    let server = RedisServer::start();
    let [seen, seeded, stale] = [(); 3].map(|()| client(LockConfig::single(server.url())));
    let key = unique_key("life:fence-garbage");
    let guard = stale.lock(&key).acquire().await.unwrap();
    guard.release().await.unwrap();
    // What makes its next attempt the script: its grant is older than the lag.
    tokio::time::sleep(FENCE_LAG).await;
    let guard = seen.lock(&key).acquire().await.unwrap();
    guard.release().await.unwrap();
    let guard = seeded
        .lock(unique_key("life:fence-garbage-clock"))
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    let () = redis::cmd("SET")
        .arg(lock_keys(&key).fence)
        .arg("not a number")
        .query(&mut server.admin())
        .unwrap();
    let transactions = server.command_calls("multi");
    for (who, locks) in [
        ("transaction", &seen),
        ("seeded transaction", &seeded),
        ("script", &stale),
    ] {
        match locks.lock(&key).acquire().await {
            Err(LockError::Unavailable { causes, .. }) => {
                assert_eq!(causes[0].kind, FailureKind::Response, "{who}: {causes:?}");
            }
            other => panic!("{who}: expected unavailable, got {other:?}"),
        }
        assert!(
            !key_exists(&server, &lock_keys(&key).lock),
            "{who}: a lock without a fence was left behind"
        );
    }
    assert_eq!(
        server.command_calls("multi") - transactions,
        2,
        "the first two tries were transactions"
    );
    forget_fence(&server, &key);
    let guard = seen.lock(&key).acquire().await.unwrap();
    assert!(guard.fencing_token().is_some());
    guard.release().await.unwrap();
}

/// The first attempt lands late (its reply times out), the counter is evicted, and the retry with
/// the same token answers "ours": that grant must still carry a token, larger than the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_token_retry_after_the_counter_is_gone_still_has_a_token() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let locks = client(LockConfig::single(proxy.url()).response_timeout(ms(200)));
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
    let locks = client(LockConfig::single(server.url()));
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
    let locks = client(LockConfig::single(server.url()));
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

/// How long a fence counter lives after its name's last grant (DEPLOYING.md).
const COUNTER_IDLE: Duration = Duration::from_secs(3600);

/// The time `key`'s fence counter has left, checked against the hour its last grant (asked at
/// `asked`) gave it: no less than the hour less the time since the ask, never more.
fn assert_counter_lives_an_hour(server: &RedisServer, key: &str, asked: Instant, path: &str) {
    let pttl: i64 = redis::cmd("PTTL")
        .arg(lock_keys(key).fence)
        .query(&mut server.admin())
        .unwrap();
    let left = u64::try_from(pttl)
        .map(Duration::from_millis)
        .unwrap_or_else(|_| panic!("{path}: the counter has no expiry (PTTL {pttl})"));
    assert!(
        left <= COUNTER_IDLE && left + asked.elapsed() + ms(1) >= COUNTER_IDLE,
        "{path}: the counter lives {left:?}, not an hour from its grant"
    );
}

/// A fence counter is not kept forever: every path that grants a token leaves its counter an
/// hour to live, counted from that grant (a name used once, as a lock per request or per user
/// is, leaves nothing behind after the hour). Its next grant after that starts from the clock,
/// as after a deletion (`fencing_tokens_grow_after_the_counter_is_deleted`).
#[tokio::test]
async fn every_grant_leaves_its_fence_counter_an_hour_to_live() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    // A reading of the server's clock: the next new name is seeded in the transaction.
    warm_up(&locks).await;
    let key = unique_key("life:fence-idle");
    let grant = |lock: lock_runtime::Lock| async move {
        let asked = Instant::now();
        let guard = lock.acquire().await.unwrap();
        assert!(guard.fencing_token().is_some_and(|t| t > 0));
        guard.release().await.unwrap();
        asked
    };
    let transactions = server.command_calls("multi");
    let asked = grant(locks.lock(&key)).await;
    assert_counter_lives_an_hour(&server, &key, asked, "a new name's seeding transaction");
    // Nearly run out: the next grant (counting on, in the transaction) gives it the hour again.
    let () = redis::cmd("PEXPIRE")
        .arg(lock_keys(&key).fence)
        .arg(5_000)
        .query(&mut server.admin())
        .unwrap();
    let asked = grant(locks.lock(&key)).await;
    assert_counter_lives_an_hour(&server, &key, asked, "the counting transaction");
    assert_eq!(server.command_calls("multi"), transactions + 2);
    // Far behind the clock, without expiry: the transaction's token is raised by the script.
    let () = redis::cmd("SET")
        .arg(lock_keys(&key).fence)
        .arg(1)
        .query(&mut server.admin())
        .unwrap();
    let scripts = server.command_calls("evalsha");
    let asked = grant(locks.lock(&key)).await;
    // The raise ran: the transaction, then the script (and the release's).
    assert_eq!(server.command_calls("multi"), transactions + 3);
    assert_eq!(
        server.command_calls("evalsha"),
        scripts + 2,
        "no raise to the clock"
    );
    assert_counter_lives_an_hour(&server, &key, asked, "the raise to the clock");
    // The scripts' own grants.
    let (fair, permits) = (
        unique_key("life:fence-idle-fair"),
        unique_key("life:fence-idle-permits"),
    );
    let asked = grant(locks.lock(&fair).fair(true)).await;
    assert_counter_lives_an_hour(&server, &fair, asked, "a fair lock");
    let asked = grant(locks.lock(&permits).permits(3)).await;
    assert_counter_lives_an_hour(&server, &permits, asked, "a permit");
}
