//! Fencing tokens grow with every grant, for a one-key lock and for each key of a multi-key lock;
//! a lock carries one when it asks, or where it costs nothing (etcd, in memory).

use lock_tests::unique_key;

use super::fixture::{Fx, two_keys};

pub(crate) async fn fencing_tokens_increase(fx: &Fx) {
    let key = unique_key("beh:fence");
    let mut last = 0;
    for _ in 0..50 {
        let guard = fx.a.lock(&key).fencing(true).acquire().await.unwrap();
        let token = guard.fencing_token().unwrap();
        assert!(token > last, "{token} after {last}");
        last = token;
        guard.release().await.unwrap();
    }
}

/// Each key of a multi-key lock has its own fencing token, from the same counter as a one-key
/// lock of that key, and it grows with every grant.
pub(crate) async fn multi_key_fencing_tokens_grow_per_key(fx: &Fx) {
    let (ka, kb) = two_keys("beh:manyfence");
    let (mut last_a, mut last_b) = (0, 0);
    for i in 0..20 {
        if i % 3 == 2 {
            // A one-key grant of a in between moves a's counter only.
            let guard = fx.a.lock(&ka).fencing(true).acquire().await.unwrap();
            let token = guard.fencing_token().unwrap();
            assert!(token > last_a, "{token} after {last_a}");
            last_a = token;
            guard.release().await.unwrap();
            continue;
        }
        let guard = fx.b.lock_many([&kb, &ka]).fencing(true).acquire().await;
        let guard = guard.unwrap();
        let (Some(ta), Some(tb)) = (guard.fencing_token_of(&ka), guard.fencing_token_of(&kb))
        else {
            panic!("no token per key: {guard:?}");
        };
        assert_eq!(
            guard.fencing_token_of("beh:manyfence:not-a-key-of-it"),
            None
        );
        assert!(ta > last_a, "{ka}: {ta} after {last_a}");
        assert!(tb > last_b, "{kb}: {tb} after {last_b}");
        (last_a, last_b) = (ta, tb);
        guard.release().await.unwrap();
    }
}
