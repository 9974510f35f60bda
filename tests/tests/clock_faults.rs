//! Steps of the Redis server's wall clock while locks are held and granted: what they do to
//! fencing tokens, to key ttls (Redis expires keys by its own wall clock) and to shared and permit
//! leases (expiries in server-clock milliseconds, in a sorted set). Rows of the fault table in
//! `lock-runtime/FAULTS.md`; several are documented limits, demonstrated here.
//!
//! The server runs under libfaketime with an offset file ([`FakeClock`]) that is read at every
//! clock read, so the step happens while the server runs; the monotonic clock (Redis's event loop,
//! the client's validity deadlines) is left alone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{Lock, LockClient, LockConfig, LockError};
use lock_tests::campaign::clock::{FakeClock, TOLERANCE, server_offset};
use lock_tests::sections::Kind;
use lock_tests::{
    RedisServer, SCHEDULING_SLACK, ServerOptions, Worker, bounded, client, key_exists, lock_keys,
    unique_key, wait_until_async,
};

const HOUR_MS: i64 = 3_600_000;
/// One request with the default timeouts: connect 1 s + response 500 ms.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1500);

/// A server whose wall clock follows the returned offset file (at 0 for now).
fn server_under_a_fake_clock() -> (FakeClock, RedisServer) {
    let clock = FakeClock::new();
    let server = RedisServer::start_with(ServerOptions {
        env: clock.env(),
        ..ServerOptions::default()
    });
    (clock, server)
}

/// Steps the server's clock to `offset_ms` and checks that its `TIME` says so.
fn step(clock: &FakeClock, server: &RedisServer, offset_ms: i64) {
    clock.set(offset_ms);
    let seen = server_offset(&mut server.admin()).expect("TIME after the step");
    let tolerance = i64::try_from(TOLERANCE.as_millis()).unwrap();
    assert!(
        (seen - offset_ms).abs() <= tolerance,
        "the server's clock is {seen} ms off, not {offset_ms}"
    );
}

async fn token(locks: &LockClient, key: &str) -> u64 {
    let guard = locks.lock(key).acquire().await.unwrap();
    let token = guard.fencing_token().unwrap();
    guard.release().await.unwrap();
    token
}

/// The clock floor raises every new token to the server's clock in microseconds; the counter
/// counts on from its last value. So a backward step leaves tokens growing while the counter
/// lives, and a forward step makes them jump to the new clock. The documented limit: once the
/// counter is lost (evicted, a restart without persistence: deleted here) after a backward step
/// larger than the time since the last grant, the next token is the clock's, below the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_clock_steps_and_fencing_tokens_a_lost_counter_after_a_step_back_is_a_documented_limit()
 {
    let (clock, server) = server_under_a_fake_clock();
    let locks = client(LockConfig::single(server.url()).fencing(true));
    let key = unique_key("clock:fence");
    let fence = lock_keys(&key).fence;

    let first = token(&locks, &key).await;
    step(&clock, &server, -HOUR_MS);
    let after_back = token(&locks, &key).await;
    assert!(
        after_back > first,
        "a step back made the token shrink although the counter lives"
    );

    step(&clock, &server, HOUR_MS);
    let after_forward = token(&locks, &key).await;
    let hour_us = u64::try_from(HOUR_MS).unwrap() * 1000;
    assert!(
        after_forward >= first + hour_us - 1_000_000,
        "a forward step of an hour raised the token by {} us only",
        after_forward - after_back
    );
    // Back to the real clock: the counter is an hour ahead of it, and counts on.
    step(&clock, &server, 0);
    let back_to_real = token(&locks, &key).await;
    assert!(
        back_to_real > after_forward,
        "the token shrank after the step back"
    );

    // The limit: the counter lost while the clock is an hour behind.
    step(&clock, &server, -HOUR_MS);
    let deleted: i64 = redis::cmd("DEL")
        .arg(&fence)
        .query(&mut server.admin())
        .unwrap();
    assert_eq!(deleted, 1, "no fence counter at {fence}");
    let after_loss = token(&locks, &key).await;
    eprintln!(
        "tokens: first, after -1h, after +1h, back at 0, counter lost at -1h: grew {}, {}, {}, \
         then {} (by {} s)",
        after_back > first,
        after_forward > after_back,
        back_to_real > after_forward,
        if after_loss > back_to_real {
            "grew"
        } else {
            "did not grow"
        },
        (i128::from(after_loss) - i128::from(back_to_real)) / 1_000_000
    );
    assert!(
        after_loss < back_to_real,
        "documented limit no longer shows: the token grew after the counter was lost behind a \
         step back (the floor would then cover this case: update FAULTS.md)"
    );
}

/// A forward step larger than the remaining ttl: Redis expires the lock key at once, by its own
/// clock. Another client is granted the lock while the holder still believes it holds it, until
/// its next renewal (at most a renewal period + one request later) finds the key gone and tells it
/// `Lost`. The same for a shared hold (a writer gets in) and a permit (a second holder of one
/// permit gets in): their leases are server-clock expiries, and the key's ttl is too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_server_clock_step_ends_held_locks_early_documented_limit() {
    let (clock, server) = server_under_a_fake_clock();
    let holder = client(LockConfig::single(server.url()).fencing(true));
    let other = client(LockConfig::single(server.url()).fencing(true));
    let ttl = Duration::from_secs(3);
    let cases: [(Kind, Kind); 3] = [
        (Kind::Exclusive, Kind::Exclusive),
        (Kind::Shared, Kind::Exclusive),
        (Kind::Permits(1), Kind::Permits(1)),
    ];
    for (held_as, taken_as) in cases {
        step(&clock, &server, 0);
        let key = unique_key("clock:forward");
        let lock =
            |locks: &LockClient, kind: Kind| -> Lock { kind.apply(locks.lock(&key).ttl(ttl)) };
        let guard = lock(&holder, held_as).acquire().await.unwrap();
        // Held: the other side is refused before the step.
        let refused = lock(&other, taken_as).acquire().await;
        assert!(
            matches!(refused, Err(LockError::Contended { .. })),
            "{held_as} held: {taken_as} got {refused:?}"
        );
        step(&clock, &server, HOUR_MS);
        let stepped = Instant::now();
        let second = bounded(
            REQUEST_TIMEOUT,
            "the other side's acquire",
            lock(&other, taken_as).acquire(),
        )
        .await;
        let overlap = second.is_ok() && !guard.is_lost();
        bounded(
            ttl / 3 + REQUEST_TIMEOUT + SCHEDULING_SLACK,
            "the holder told lost",
            guard.lost(),
        )
        .await;
        let told = stepped.elapsed();
        eprintln!(
            "{held_as} held, clock +1h: {taken_as} granted {}, while the holder still held it: \
             {overlap}; the holder told lost {told:?} after the step (validity {:?})",
            second.is_ok(),
            lock_tests::default_validity(ttl)
        );
        assert!(
            overlap,
            "{held_as} held, clock +1h: {taken_as} got {second:?} (documented limit no longer \
             shows: update FAULTS.md)"
        );
        let released = guard.release().await;
        assert!(
            matches!(released, Err(LockError::Lost { .. })),
            "{held_as}: the holder's release said {released:?}"
        );
        second.unwrap().release().await.unwrap();
    }
}

/// A backward step: every expiry already set (the key's ttl, a permit's lease) is in server
/// clock time, so a holder that died just before the step keeps the lock the step longer than
/// its ttl; stepping the clock back to the real time frees it within its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backward_server_clock_step_delays_a_dead_holders_expiry_documented_limit() {
    let (clock, server) = server_under_a_fake_clock();
    let locks = client(LockConfig::single(server.url()).fencing(true));
    let ttl = Duration::from_secs(1);
    for kind in [Kind::Exclusive, Kind::Permits(1)] {
        step(&clock, &server, 0);
        let key = unique_key("clock:backward");
        let lock_key = lock_keys(&key).lock;
        let mut args = vec![server.url(), key.clone(), ttl.as_millis().to_string()];
        if kind != Kind::Exclusive {
            args.push(kind.to_string());
        }
        let mut dead = Worker::spawn(env!("CARGO_BIN_EXE_holder"), &args);
        let line = dead.next_line(Duration::from_secs(20));
        assert!(line.starts_with("acquired"), "holder said {line:?}");
        dead.kill();
        step(&clock, &server, -HOUR_MS);
        let stepped = Instant::now();
        // Past the ttl and a backoff: the lock is still taken.
        let refused = kind
            .apply(locks.lock(&key).ttl(ttl).wait(ttl * 2))
            .acquire()
            .await;
        let waited = stepped.elapsed();
        assert!(
            matches!(refused, Err(LockError::Contended { .. })),
            "{kind}: {refused:?} after {waited:?}"
        );
        assert!(key_exists(&server, &lock_key), "{kind}: the key is gone");
        step(&clock, &server, 0);
        let back = Instant::now();
        let guard = bounded(
            ttl + REQUEST_TIMEOUT,
            "acquire after the clock came back",
            kind.apply(locks.lock(&key).ttl(ttl).wait(ttl + SCHEDULING_SLACK))
                .acquire(),
        )
        .await
        .expect("the dead holder's lock never freed after the clock came back");
        eprintln!(
            "{kind}: a dead holder's lock still held {waited:?} after a -1h step (ttl {ttl:?}); \
             free {:?} after the clock came back",
            back.elapsed()
        );
        guard.release().await.unwrap();
        wait_until_async(ttl, "released", || !key_exists(&server, &lock_key)).await;
    }
}

/// The value of `name=<n>` in a `memory_fences` line.
fn field(line: &str, name: &str) -> u128 {
    line.split_whitespace()
        .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
}

/// The client's wall clock stepped back an hour under the in-memory backend (a child process
/// under libfaketime): the wall clock only seeds a name's counter the first time the name is
/// used, and counters are never dropped, so an existing name's tokens keep growing; a name first
/// used after the step starts from the stepped-back clock, which no token of that name preceded.
#[test]
fn a_client_clock_step_back_leaves_in_memory_tokens_growing() {
    let clock = FakeClock::new();
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let env = clock.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut child = Worker::spawn_with_env(
        env!("CARGO_BIN_EXE_memory_fences"),
        &[go.to_str().unwrap()],
        &env,
    );
    let before = child.next_line(Duration::from_secs(20));
    clock.set(-HOUR_MS);
    std::fs::write(&go, b"").unwrap();
    let after = child.next_line(Duration::from_secs(20));
    child
        .finish(Duration::from_secs(10))
        .assert_success("memory_fences");
    eprintln!(
        "in memory, client clock -1h: a grew {}, the new name b below a's tokens {}",
        field(&after, "a") > field(&before, "a"),
        field(&after, "b") < field(&before, "a")
    );
    // The cause: the child's wall clock went back by the hour (less the time between the lines).
    let stepped = i128::try_from(field(&before, "wall_ms")).unwrap()
        - i128::try_from(field(&after, "wall_ms")).unwrap();
    assert!(
        (i128::from(HOUR_MS) - stepped).abs() < 5_000,
        "the child's clock moved back {stepped} ms"
    );
    assert!(
        field(&after, "a") > field(&before, "a"),
        "an existing name's token did not grow across the step"
    );
    assert!(
        field(&after, "b") < field(&before, "a"),
        "a new name's first token was not seeded by the stepped clock"
    );
}
