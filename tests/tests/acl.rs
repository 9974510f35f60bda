//! The behaviour suite once more as a least-privilege ACL user, and a wrong password.

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod behaviour;

use lock_runtime::{FailureKind, LockClient, LockConfig, LockError};

behaviour_tests!(behaviour::Fx::redis_acl());

#[tokio::test]
async fn wrong_password_is_an_auth_error_not_contention() {
    let fx = behaviour::Fx::redis_acl();
    let server = fx.server.as_ref().unwrap();
    let client = LockClient::new(LockConfig::single(server.url_as("locker", "wrong"))).unwrap();
    match client.lock("acl:wrongpw").acquire().await {
        Err(LockError::Unavailable { causes, .. }) => {
            assert_eq!(causes.len(), 1);
            assert_eq!(causes[0].kind, FailureKind::Auth, "{causes:?}");
            let shown = format!("{causes:?} {}", causes[0]);
            assert!(!shown.contains("wrong"), "{shown}");
        }
        other => panic!("expected an auth failure, got {other:?}"),
    }
}

#[tokio::test]
async fn a_prefix_outside_the_acl_is_a_permission_error() {
    let fx = behaviour::Fx::redis_acl();
    let server = fx.server.as_ref().unwrap();
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
