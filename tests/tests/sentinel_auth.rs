//! Sentinels that require a password of their own (`requirepass` on the sentinels, another one
//! on the data nodes): the sentinels' password goes in the sentinel URLs, the master's in
//! `LockConfig::master_auth`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{FailureKind, LockClient, LockConfig, LockError, NodeFailure};
use lock_tests::{SentinelOptions, SentinelSet, lock_keys, unique_key};

const SENTINEL_PASSWORD: &str = "sentinel-s3cret";
const MASTER_PASSWORD: &str = "master-s3cret";

fn sentinel_set() -> SentinelSet {
    SentinelSet::start_with(SentinelOptions {
        password: Some(MASTER_PASSWORD.to_owned()),
        sentinel_password: Some(SENTINEL_PASSWORD.to_owned()),
        ..SentinelOptions::default()
    })
}

/// Neither password shows in `text`.
#[track_caller]
fn no_password_in(text: &str) {
    assert!(
        !text.contains(SENTINEL_PASSWORD) && !text.contains(MASTER_PASSWORD),
        "a password shows: {text}"
    );
}

/// One attempt, waiting up to `wait`, that must fail as `Unavailable` with kind `Auth` at once
/// (a missing or wrong password is not retried for the wait); its one cause. Neither password
/// shows in the config's `Debug` or in the error.
async fn refused(config: LockConfig) -> NodeFailure {
    no_password_in(&format!("{config:?}"));
    let client = LockClient::new(config).unwrap();
    let wait = Duration::from_secs(3);
    let started = Instant::now();
    let outcome = client
        .lock(unique_key("sentinel:auth"))
        .wait(wait)
        .acquire()
        .await;
    let took = started.elapsed();
    let err = match outcome {
        Err(err @ LockError::Unavailable { .. }) => err,
        Err(other) => panic!("expected Unavailable, got {other}"),
        Ok(_) => panic!("granted"),
    };
    eprintln!("refused after {took:?}: {err}");
    no_password_in(&err.to_string());
    no_password_in(&format!("{err:?}"));
    assert!(took < wait, "retried for the wait: {took:?}");
    let LockError::Unavailable { mut causes, .. } = err else {
        unreachable!()
    };
    assert_eq!(causes.len(), 1, "{causes:?}");
    let cause = causes.remove(0);
    assert_eq!(cause.kind, FailureKind::Auth, "{cause:?}");
    cause
}

/// `cause` has, for each sentinel at `addrs`, an answer of its own that says `what`.
#[track_caller]
fn each_sentinel_says(cause: &NodeFailure, addrs: &[String], what: &str) {
    for addr in addrs {
        assert!(
            cause
                .detail
                .split("; ")
                .any(|answer| answer.contains(&format!("{addr}: "))
                    && answer.to_lowercase().contains(&what.to_lowercase())),
            "{addr} does not say {what}: {cause:?}"
        );
    }
}

/// The sentinels' password in their URLs and the master's in `master_auth` take a lock on the
/// master. Without the sentinels' password (or with a wrong one) the call is `Unavailable`
/// (`Auth`, not retried) naming every sentinel; without `master_auth` the URLs' password is
/// the sentinels', which the master refuses. No password shows in `Debug` or in an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_password_in_the_urls_authenticates_to_the_sentinels() {
    let set = sentinel_set();
    let urls = set.sentinel_urls();
    assert!(urls.iter().all(|url| url.contains(SENTINEL_PASSWORD)));
    let config = LockConfig::sentinel(SentinelSet::MASTER_NAME, urls.clone())
        .fencing(true)
        .master_auth("", MASTER_PASSWORD);
    no_password_in(&format!("{config:?}"));
    let client = LockClient::new(config).unwrap();
    let key = unique_key("sentinel:auth");
    let guard = client.lock(&key).acquire().await.unwrap();
    assert!(guard.fencing_token().is_some());
    assert_eq!(set.master().keys(&lock_keys(&key).lock).len(), 1);
    guard.release().await.unwrap();
    assert!(set.master().keys(&lock_keys(&key).lock).is_empty());

    let addrs: Vec<String> = set
        .sentinels
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let without: Vec<String> = addrs.iter().map(|a| format!("redis://{a}/")).collect();
    let cause = refused(
        LockConfig::sentinel(SentinelSet::MASTER_NAME, without).master_auth("", MASTER_PASSWORD),
    )
    .await;
    each_sentinel_says(&cause, &addrs, "NOAUTH");

    let wrong: Vec<String> = addrs
        .iter()
        .map(|a| format!("redis://:wrong-pw@{a}/"))
        .collect();
    let cause = refused(
        LockConfig::sentinel(SentinelSet::MASTER_NAME, wrong).master_auth("", MASTER_PASSWORD),
    )
    .await;
    assert!(!cause.detail.contains("wrong-pw"), "{cause:?}");
    each_sentinel_says(&cause, &addrs, "authentication failed");

    // Without `master_auth`, the master is asked with the sentinels' password, and refuses it.
    let cause = refused(LockConfig::sentinel(SentinelSet::MASTER_NAME, urls)).await;
    let master = format!("127.0.0.1:{}", set.master().port());
    assert_eq!(cause.node, master, "{cause:?}");
}
