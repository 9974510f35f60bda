//! The behaviour suite once more as a least-privilege ACL user, and a prefix outside its rights.
//! (A wrong password, for this user and others, is in credentials.rs.)

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod behaviour;

use std::time::{Duration, Instant};

use lock_runtime::{FailureKind, LockClient, LockConfig, LockError};
use lock_tests::{RedisServer, SCHEDULING_SLACK, ServerOptions, bounded};

/// The least-privilege ACL user DEPLOYING.md documents: its scripts, pub/sub on its channels, keys
/// and channels under its prefix.
const ACL_RULE: &str = "user locker on >lockpw resetkeys ~lock:* resetchannels &lock:* -@all \
     +evalsha +eval +script|load +subscribe +unsubscribe +ping +select \
     +set +get +del +incr +pexpire +pttl +publish +time +type +exists +zadd +zrem +zscore +zcard \
     +zcount +zrange +zrangebyscore +zremrangebyscore";

fn server_with(rule: &str) -> RedisServer {
    RedisServer::start_with(ServerOptions {
        acl_rules: vec![rule.to_owned()],
        ..ServerOptions::default()
    })
}

fn server() -> RedisServer {
    server_with(ACL_RULE)
}

fn fixture_with(rule: &str) -> behaviour::Fx {
    let server = server_with(rule);
    let url = server.url_as("locker", "lockpw");
    behaviour::Fx::new(LockConfig::single(url), vec![server])
}

fn fixture() -> behaviour::Fx {
    fixture_with(ACL_RULE)
}

behaviour_tests!(fixture());
kind_tests!(fixture());

/// A key prefix the ACL does not cover: `Unavailable` with `Permission` at once, within one
/// request timeout (connect 1 s + response 500 ms, the defaults) + slack, although the call may
/// wait 2 s: a refusal is not retried until the wait runs out.
#[tokio::test]
async fn a_prefix_outside_the_acl_is_a_permission_error() {
    let server = server();
    let client =
        LockClient::new(LockConfig::single(server.url_as("locker", "lockpw")).key_prefix("other:"))
            .unwrap();
    let wait = Duration::from_secs(2);
    let request = Duration::from_millis(1500);
    let started = Instant::now();
    let result = bounded(
        wait + request + Duration::from_secs(2),
        "acquire outside the ACL",
        client.lock("acl:prefix").wait(wait).acquire(),
    )
    .await;
    let took = started.elapsed();
    eprintln!("prefix outside the ACL, wait {wait:?}: answered after {took:?}");
    match result {
        Err(LockError::Unavailable { causes, .. }) => {
            assert_eq!(causes[0].kind, FailureKind::Permission, "{causes:?}");
        }
        other => panic!("expected a permission failure, got {other:?}"),
    }
    assert!(
        took <= request + SCHEDULING_SLACK,
        "the permission error came after {took:?}: retried within the wait"
    );
    assert!(
        server.info("errorstats").contains("errorstat_NOPERM"),
        "the server never refused a lock command: the denial came from elsewhere"
    );
}

/// How many script runs failed for another reason than a script the server did not have (a
/// `NOSCRIPT` counts as a failed call too): here, a command the ACL refuses inside a script.
/// The counters come from one reading: read apart, a `NOSCRIPT` between them made the difference
/// negative.
fn refused_scripts(server: &RedisServer) -> u64 {
    let stats = server.stats();
    let failed = stats.command("evalsha", "failed_calls") + stats.command("eval", "failed_calls");
    failed
        .checked_sub(stats.errors("NOSCRIPT"))
        .expect("every NOSCRIPT is a failed script call")
}

/// Where the ACL refuses the fair queue's sorted-set commands, a plain lock's waiter that starves
/// (waits past 10 ms) cannot take a place in the queue: refused once, it goes on waiting as a
/// plain waiter and gets the lock when the holder lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starving_waiter_refused_the_queue_still_gets_a_plain_lock() {
    let rule = ACL_RULE
        .split(' ')
        .filter(|part| !part.starts_with("+z"))
        .collect::<Vec<_>>()
        .join(" ");
    let server = server_with(&rule);
    let url = server.url_as("locker", "lockpw");
    let holder = LockClient::new(LockConfig::single(url.clone())).unwrap();
    let waiter = LockClient::new(LockConfig::single(url)).unwrap();
    let key = lock_tests::unique_key("acl:starving");
    let held = holder.lock(&key).acquire().await.unwrap();
    let before = refused_scripts(&server);
    let waiting = {
        let key = key.clone();
        tokio::spawn(async move {
            waiter
                .lock(&key)
                .wait(Duration::from_secs(5))
                .acquire()
                .await
        })
    };
    lock_tests::wait_until_async(
        Duration::from_secs(2),
        "the queueing attempt refused",
        || refused_scripts(&server) > before,
    )
    .await;
    held.release().await.unwrap();
    let guard = bounded(Duration::from_secs(6), "the waiter", waiting)
        .await
        .unwrap()
        .expect("the waiter refused the queue gets the lock");
    guard.release().await.unwrap();
    assert_eq!(
        refused_scripts(&server),
        before + 1,
        "the queue is asked for once, then never again"
    );
}
