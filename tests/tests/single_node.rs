//! The behaviour suite on one Redis node, as the default user.

#![allow(clippy::unwrap_used, clippy::expect_used)]
mod behaviour;

fn fixture() -> behaviour::Fx {
    let server = lock_tests::RedisServer::start();
    behaviour::Fx::new(lock_runtime::LockConfig::single(server.url()), vec![server])
}

behaviour_tests!(fixture());
kind_tests!(fixture());

/// A second runtime after the first is gone: the client lives on the library's runtime.
#[test]
fn works_across_successive_runtimes() {
    let fx = fixture();
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

/// `redis://host:port/3` selects database 3: the lock lives there and nowhere else.
#[tokio::test]
async fn the_url_database_is_used() {
    let server = lock_tests::RedisServer::start();
    let url = format!("{}3", server.url());
    let client = lock_runtime::LockClient::new(lock_runtime::LockConfig::single(url)).unwrap();
    let key = lock_tests::unique_key("single:db");
    let guard = client.lock(&key).acquire().await.unwrap();
    let mut admin = server.admin();
    let in_db = |db: i64, admin: &mut redis::Connection| -> i64 {
        let _: () = redis::cmd("SELECT").arg(db).query(admin).unwrap();
        redis::cmd("EXISTS")
            .arg(lock_tests::lock_keys(&key).lock)
            .query(admin)
            .unwrap()
    };
    assert_eq!(in_db(3, &mut admin), 1);
    assert_eq!(in_db(0, &mut admin), 0);
    guard.release().await.unwrap();
    assert_eq!(in_db(3, &mut admin), 0);
}
