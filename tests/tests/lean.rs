//! What a lock costs on one Redis node, counted with `INFO commandstats` (which the machine's
//! load does not move): an unfenced, uncontended pair is the hand-written pair (`SET NX PX`, and
//! a compare-and-delete script of `GET` and `DEL`), a fenced one adds its counter's `INCR` and
//! `TIME`, and a release announces itself only when someone waits for the lock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use lock_runtime::{LockClient, LockConfig};
use lock_tests::{
    FaultProxy, RedisServer, ServerOptions, await_waiter, bounded, client, key_exists, lock_keys,
    unique_key, wait_until_async, warm_up,
};

const PAIRS: u64 = 20;

/// `PAIRS` acquire+release pairs of distinct names, nobody else on them.
async fn pairs(locks: &LockClient, fencing: bool) {
    for i in 0..PAIRS {
        let lock = locks.lock(unique_key(&format!("lean:pair{i}")));
        let guard = lock.fencing(fencing).acquire().await.unwrap();
        assert_eq!(guard.fencing_token().is_some(), fencing);
        guard.release().await.unwrap();
    }
}

fn counts(of: &[(&str, u64)]) -> BTreeMap<String, u64> {
    of.iter().map(|(c, n)| ((*c).to_owned(), *n)).collect()
}

#[tokio::test]
async fn an_unfenced_uncontended_pair_is_the_hand_written_pair() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()));
    // Connected, and the release script loaded.
    warm_up(&locks).await;
    let before = server.stats();
    pairs(&locks, false).await;
    assert_eq!(
        server.stats().since(&before),
        counts(&[
            ("del", PAIRS),
            ("evalsha", PAIRS),
            ("get", PAIRS),
            ("set", PAIRS)
        ]),
        "4 commands a pair"
    );
    assert!(server.keys("*").is_empty(), "{:?}", server.keys("*"));
}

/// A fenced pair: the acquire script's `SET NX PX GET`, `INCR` and `TIME` (and a `SET` raising
/// the counter to the server's clock, when it fell more than 100 ms behind: here at the first
/// grant, as the counter does not exist, and at most once per 100 ms after), then the release.
#[tokio::test]
async fn a_fenced_uncontended_pair_adds_its_counter_and_the_clock() {
    let server = RedisServer::start();
    let locks = client(LockConfig::single(server.url()).fencing(true));
    warm_up(&locks).await;
    let before = server.stats();
    let started = std::time::Instant::now();
    pairs(&locks, true).await;
    let mut ran = server.stats().since(&before);
    let raises = ran.get("set").copied().unwrap_or(0) - PAIRS;
    let bound = 1 + u64::try_from(started.elapsed().as_millis() / 100).unwrap();
    assert!(
        raises <= bound,
        "{raises} raises in {:?}",
        started.elapsed()
    );
    ran.insert("set".to_owned(), PAIRS);
    assert_eq!(
        ran,
        counts(&[
            ("del", PAIRS),
            ("evalsha", 2 * PAIRS),
            ("get", PAIRS),
            ("incr", PAIRS),
            ("set", PAIRS),
            ("time", PAIRS),
        ]),
        "7 commands a pair, and the raises"
    );
    assert_eq!(server.keys("*"), [lock_keys("any").fence]);
}

/// A release nobody waits for announces nothing; one somebody waits for wakes it. The waiter
/// would otherwise sleep at least half its 5 s retry delay (the holder's ttl is longer), so a
/// grant within 2 s can only be the wake-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_announces_itself_only_when_someone_waits() {
    announces_itself_only_when_someone_waits(RedisServer::start(), false).await;
}

/// The same on Valkey, whose own `DELIFEQ` releases: the flag read in the same round trip, and
/// the wake-up script only behind the release somebody waits for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_valkey_a_native_release_announces_itself_only_when_someone_waits() {
    let Some(server) = valkey(ServerOptions::default()) else {
        return;
    };
    announces_itself_only_when_someone_waits(server, true).await;
}

async fn announces_itself_only_when_someone_waits(server: RedisServer, native: bool) {
    let config = LockConfig::single(server.url()).retry_delay(Duration::from_secs(5));
    let [holder, waiter] = [(); 2].map(|()| client(config.clone()));
    // Connected, and (on Valkey) the server asked for its own commands.
    warm_up(&holder).await;
    let key = unique_key("lean:wake");
    let keys = lock_keys(&key);
    let alone = holder.lock(&key).acquire().await.unwrap();
    let [publishes, scripts, deletes] =
        ["publish", "evalsha", "delifeq"].map(|c| server.command_calls(c));
    alone.release().await.unwrap();
    assert_eq!(server.command_calls("publish"), publishes, "nobody waited");
    if native {
        assert_eq!(server.command_calls("delifeq"), deletes + 1);
        assert_eq!(server.command_calls("evalsha"), scripts, "no script");
    }

    let held = holder.lock(&key).acquire().await.unwrap();
    let asked = server.command_calls("pttl");
    let waiting = tokio::spawn({
        let lock = waiter.lock(&key).wait(Duration::from_secs(20));
        async move { lock.acquire().await }
    });
    await_waiter(&server, &key).await;
    // Its first attempt, and the one after its subscription was confirmed: both refused, each
    // marking the lock waited for and reading its time to live.
    wait_until_async(Duration::from_secs(5), "two refused attempts", || {
        server.command_calls("pttl") >= asked + 2
    })
    .await;
    assert!(key_exists(&server, &keys.waiting), "no waiting mark");
    held.release().await.unwrap();
    let got = bounded(Duration::from_secs(2), "the woken waiter", waiting)
        .await
        .unwrap()
        .unwrap();
    // One wake-up (on Valkey `DELIFEQ` publishes nothing, so the script behind it ran; it wakes
    // the waiters even when one of them took the lock between the two).
    assert_eq!(server.command_calls("publish"), publishes + 1);
    if native {
        assert_eq!(server.command_calls("delifeq"), deletes + 2);
        // For a second after a release met waiters, this server's releases go by script,
        // which deletes and wakes in one round trip.
        let released_at = std::time::Instant::now();
        let other = holder
            .lock(unique_key("lean:next"))
            .acquire()
            .await
            .unwrap();
        other.release().await.unwrap();
        if released_at.elapsed() < Duration::from_millis(900) {
            assert_eq!(server.command_calls("delifeq"), deletes + 2, "by script");
        }
    }
    // A waiter that waited past its 10 ms threshold before the release (a loaded machine) took
    // a place in the lock's queue: the release then handed it the lock, told it alone, and kept
    // the mark for as long as the handed lock lives (see `EXCLUSIVE_RELEASE`).
    if server.command_calls("zadd") == 0 {
        assert!(
            !key_exists(&server, &keys.waiting),
            "the release kept the mark"
        );
    }
    got.release().await.unwrap();
    assert!(server.keys(&format!("*{key}*")).is_empty());
}

/// A `valkey-server` (`LOCK_TESTS_VALKEY_SERVER`, or the one `scripts/test.sh` fetches) with
/// `options`; `None` when the Valkey tests are skipped.
fn valkey(options: ServerOptions) -> Option<RedisServer> {
    let binary = lock_tests::valkey_server()?;
    Some(RedisServer::start_with(ServerOptions {
        binary: Some(binary),
        ..options
    }))
}

/// Valkey 9 has the lock's own compare-and-delete (`DELIFEQ`): the pair is `SET NX PX GET`, and
/// `DELIFEQ` with `EXISTS` on the waiting flag in one round trip; no script.
#[tokio::test]
async fn on_valkey_an_unfenced_uncontended_pair_runs_no_script() {
    let Some(server) = valkey(ServerOptions::default()) else {
        return;
    };
    let locks = client(LockConfig::single(server.url()));
    // Connected, and the server asked which commands it has.
    warm_up(&locks).await;
    let before = server.stats();
    pairs(&locks, false).await;
    let mut ran = server.stats().since(&before);
    // A connection's handshake (Valkey has `CLIENT SETINFO`, Redis 7.0 not), not the pairs'.
    ran.remove("client|setinfo");
    assert_eq!(
        ran,
        counts(&[("delifeq", PAIRS), ("exists", PAIRS), ("set", PAIRS)]),
        "3 commands a pair"
    );
    assert!(server.keys("*").is_empty(), "{:?}", server.keys("*"));
}

/// A held lock renews with `SET .. IFEQ .. PX` on Valkey: no script, and the lock stays ours
/// past its ttl.
#[tokio::test]
async fn on_valkey_a_held_lock_renews_without_a_script() {
    let Some(server) = valkey(ServerOptions::default()) else {
        return;
    };
    let locks = client(LockConfig::single(server.url()));
    warm_up(&locks).await;
    let key = unique_key("lean:renew");
    let ttl = Duration::from_millis(300);
    let before = server.stats();
    let guard = locks.lock(&key).ttl(ttl).acquire().await.unwrap();
    // The grant's `SET`, then three renewals (one each third of the ttl).
    wait_until_async(ttl * 3 + Duration::from_secs(2), "three renewals", || {
        server.command_calls("set") >= before.command("set", "calls") + 4
    })
    .await;
    assert!(!guard.is_lost());
    assert!(
        key_exists(&server, &lock_keys(&key).lock),
        "renewed past its ttl"
    );
    let ran = server.stats().since(&before);
    assert_eq!(ran.get("evalsha"), None, "{ran:?}");
    guard.release().await.unwrap();
}

/// A server whose ACL refuses `DELIFEQ` (it still lists it in `COMMAND DOCS`): the first
/// release is refused (`NOPERM`) and made by script, and so is every later one; nothing is
/// left behind.
#[tokio::test]
async fn on_valkey_a_refused_delifeq_releases_by_script_from_then_on() {
    let rule = "user locker on >lockpw ~* &* +@all -delifeq".to_owned();
    let Some(server) = valkey(ServerOptions {
        acl_rules: vec![rule],
        ..ServerOptions::default()
    }) else {
        return;
    };
    let locks = client(LockConfig::single(server.url_as("locker", "lockpw")));
    warm_up(&locks).await;
    let before = server.stats();
    pairs(&locks, false).await;
    assert_eq!(
        server.stats().command("delifeq", "rejected_calls")
            - before.command("delifeq", "rejected_calls"),
        1,
        "refused once, then not sent"
    );
    assert_eq!(server.stats().since(&before).get("evalsha"), Some(&PAIRS));
    assert!(server.keys("*").is_empty(), "{:?}", server.keys("*"));
}

/// The server behind the client's address is replaced by one without `DELIFEQ` (here a Valkey
/// with the command renamed away; Redis 7.0 or an older Valkey alike): the client learned
/// `DELIFEQ` from the first, the second answers "unknown command", and the release is made by
/// script, then and from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_delifeq_behind_the_same_address_is_released_by_script() {
    let Some(first) = valkey(ServerOptions::default()) else {
        return;
    };
    let Some(second) = valkey(ServerOptions {
        config_lines: vec![r#"rename-command DELIFEQ """#.to_owned()],
        ..ServerOptions::default()
    }) else {
        return;
    };
    let proxy = FaultProxy::start(first.port());
    let locks = client(LockConfig::single(proxy.url()));
    warm_up(&locks).await;
    let key = unique_key("lean:replaced");
    let guard = locks.lock(&key).acquire().await.unwrap();
    guard.release().await.unwrap();
    assert_eq!(first.command_calls("delifeq"), 1, "released natively");

    proxy.set_upstream(second.port());
    proxy.cut_all();
    for round in 0..2 {
        let guard = bounded(
            Duration::from_secs(5),
            "a grant from the new server",
            locks.lock(&key).wait(Duration::from_secs(4)).acquire(),
        )
        .await
        .unwrap();
        assert!(key_exists(&second, &lock_keys(&key).lock));
        guard.release().await.unwrap();
        assert!(!key_exists(&second, &lock_keys(&key).lock), "round {round}");
        assert_eq!(
            second.error_count("ERR"),
            1,
            "DELIFEQ refused once, round {round}"
        );
    }
    // The first also met `NOSCRIPT` (a new server): loaded and sent again.
    assert_eq!(second.error_count("NOSCRIPT"), 1);
    assert_eq!(
        second.command_calls("evalsha"),
        3,
        "both released by script"
    );
}

/// A waiter with a short wait, refused after one that waits on, must not shorten the lock's
/// waiting flag: the flag would lapse when the short wait ends, the holder's release would wake
/// nobody, and the long waiter (whose polls are seconds apart) would sleep through it. Found by
/// the model (`lock-model/tests/found.rs`): the plain waiter's `SET waiting 1 PX <its wait>`
/// replaced a longer mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_waiter_does_not_shorten_a_long_waiters_mark() {
    let server = RedisServer::start();
    let config = LockConfig::single(server.url()).retry_delay(Duration::from_secs(5));
    let [holder, long, short] = [(); 3].map(|()| client(config.clone()));
    let key = unique_key("lean:marks");
    let keys = lock_keys(&key);
    let held = holder.lock(&key).acquire().await.unwrap();
    let asked = server.command_calls("pttl");
    let waiting = tokio::spawn({
        let lock = long.lock(&key).wait(Duration::from_secs(30));
        async move { lock.acquire().await }
    });
    // Its first attempt and the one after its subscription was confirmed, each marking the lock.
    wait_until_async(
        Duration::from_secs(5),
        "the long waiter refused twice",
        || server.command_calls("pttl") >= asked + 2,
    )
    .await;
    let pttl = || -> i64 {
        redis::cmd("PTTL")
            .arg(&keys.waiting)
            .query(&mut server.admin())
            .expect("PTTL of the waiting flag")
    };
    let marked = pttl();
    let since = std::time::Instant::now();
    let refused = short
        .lock(&key)
        .wait(Duration::from_millis(300))
        .acquire()
        .await;
    assert!(refused.is_err(), "the short waiter was granted");
    // The long waiter's mark, less the time that passed (and a few milliseconds of rounding:
    // a shortened mark lives at most the short waiter's 300 ms).
    let left = marked - i64::try_from(since.elapsed().as_millis()).unwrap() - 5;
    let now = pttl();
    assert!(
        now >= left,
        "the short waiter shortened the waiting flag from {left} ms to {now} ms"
    );
    held.release().await.unwrap();
    let got = bounded(Duration::from_secs(2), "the long waiter, woken", waiting)
        .await
        .unwrap()
        .unwrap();
    got.release().await.unwrap();
}
