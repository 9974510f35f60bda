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
     +evalsha +eval +script|load +subscribe +unsubscribe +ping +select +multi +exec \
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

/// The rule as documented before plain locks were taken with MULTI/EXEC: the server refuses the
/// transaction (and runs its commands on their own), and the client takes the script instead.
mod without_transactions {
    use super::{ACL_RULE, behaviour, fixture_with};
    use crate::behaviour_tests;

    behaviour_tests!(fixture_with(&ACL_RULE.replace(" +multi +exec", "")));
}

/// MULTI allowed but not EXEC: the server discards the transaction at the refused EXEC, and the
/// client takes the script instead.
mod without_exec {
    use super::{ACL_RULE, behaviour, fixture_with};
    use crate::behaviour_tests;

    behaviour_tests!(fixture_with(&ACL_RULE.replace(" +exec", "")));
}

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

/// How many MULTIs reached the server, run or refused.
fn transactions_tried(server: &RedisServer) -> u64 {
    server.command_calls("multi") + server.command_stat("multi", "rejected_calls")
}

/// Where the ACL refuses MULTI or EXEC, a client tries one transaction, then takes the script for
/// good (it does not pay a refused transaction on every attempt); every lock still works.
#[tokio::test]
async fn a_refused_transaction_is_tried_once() {
    for missing in [" +multi", " +exec"] {
        let server = server_with(&ACL_RULE.replace(missing, ""));
        let client =
            LockClient::new(LockConfig::single(server.url_as("locker", "lockpw"))).unwrap();
        let key = lock_tests::unique_key("acl:refused");
        let mut last = 0;
        for _ in 0..5 {
            let guard = client.lock(&key).acquire().await.unwrap();
            let fence = guard.fencing_token().unwrap();
            assert!(fence > last, "without{missing}: fence {fence} after {last}");
            last = fence;
            guard.release().await.unwrap();
        }
        assert_eq!(transactions_tried(&server), 1, "without{missing}");
    }
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
