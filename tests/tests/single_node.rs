//! The behaviour suite on one Redis node, as the default user.

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod behaviour;

behaviour_tests!(behaviour::Fx::redis());

/// A second runtime after the first is gone: the client lives on the library's runtime.
#[test]
fn works_across_successive_runtimes() {
    let fx = behaviour::Fx::redis();
    let key = lock_tests::unique_key("single:runtimes");
    for _ in 0..3 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let guard = fx.a.lock(&key).acquire().await.unwrap();
            guard.release().await.unwrap();
        });
        drop(rt);
    }
    // And from plain sync code with no runtime at all.
    fx.a.lock(&key)
        .acquire_blocking()
        .unwrap()
        .release_blocking()
        .unwrap();
}
