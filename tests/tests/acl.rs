//! The behaviour suite once more as a least-privilege ACL user, and a prefix outside its rights.
//! (A wrong password, for this user and others, is in faults.rs.)

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod behaviour;

use lock_runtime::{FailureKind, LockClient, LockConfig, LockError};
use lock_tests::{RedisServer, ServerOptions};

/// The least-privilege ACL user the README documents: its scripts, pub/sub on its channels, keys
/// and channels under its prefix.
const ACL_RULE: &str = "user locker on >lockpw resetkeys ~lock:* resetchannels &lock:* -@all \
     +evalsha +eval +script|load +subscribe +unsubscribe +ping +select \
     +set +get +del +incr +pexpire +pttl +publish +time +type +exists +zadd +zrem +zscore +zcard \
     +zcount +zrange +zrangebyscore +zremrangebyscore";

fn server() -> RedisServer {
    RedisServer::start_with(ServerOptions {
        acl_rules: vec![ACL_RULE.to_owned()],
        ..ServerOptions::default()
    })
}

fn fixture() -> behaviour::Fx {
    let server = server();
    let url = server.url_as("locker", "lockpw");
    behaviour::Fx::new(LockConfig::single(url), vec![server])
}

behaviour_tests!(fixture());
kind_tests!(fixture());

#[tokio::test]
async fn a_prefix_outside_the_acl_is_a_permission_error() {
    let server = server();
    let client =
        LockClient::new(LockConfig::single(server.url_as("locker", "lockpw")).key_prefix("other:"))
            .unwrap();
    match client.lock("acl:prefix").acquire().await {
        Err(LockError::Unavailable { causes, .. }) => {
            assert_eq!(causes[0].kind, FailureKind::Permission, "{causes:?}");
        }
        other => panic!("expected a permission failure, got {other:?}"),
    }
}
