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

/// A server that lost its scripts (`SCRIPT FLUSH`; a restart behind a reconnect that no call of
/// the client saw fail) answers the release's `EVALSHA` with `NOSCRIPT`: the client sends the
/// script's load with the call again, and the lock is released (or, under `min_hold`, kept for
/// the rest of it). The `NOSCRIPT` count proves each release met a server without the script.
#[tokio::test]
async fn a_release_to_a_server_that_lost_its_scripts_still_lets_go() {
    let server = lock_tests::RedisServer::start();
    let client =
        lock_runtime::LockClient::new(lock_runtime::LockConfig::single(server.url())).unwrap();
    let key = lock_tests::unique_key("single:noscript");
    let lock_key = lock_tests::lock_keys(&key).lock;
    let min_hold = std::time::Duration::from_secs(30);
    // A first release, and a first release under min_hold, load their scripts: the next ones do
    // not carry the load.
    lock_tests::warm_up(&client).await;
    let warm = lock_tests::unique_key("single:noscript-warm");
    let guard = client
        .lock(&warm)
        .min_hold(min_hold)
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();

    // Takes `lock`, flushes the scripts and lets go; asserts that the release met no script.
    let let_go_without_scripts = async |lock: lock_runtime::Lock, what: &str| {
        let guard = lock.acquire().await.unwrap();
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut server.admin())
            .unwrap();
        let before = server.error_count("NOSCRIPT");
        guard.release().await.unwrap();
        assert_eq!(
            server.error_count("NOSCRIPT"),
            before + 1,
            "the {what} met no script"
        );
    };
    let_go_without_scripts(client.lock(&key), "release").await;
    assert!(!lock_tests::key_exists(&server, &lock_key), "released");

    let_go_without_scripts(client.lock(&key).min_hold(min_hold), "keep").await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&lock_key)
        .query(&mut server.admin())
        .unwrap();
    assert!(
        pttl > 0 && u128::try_from(pttl).unwrap() <= min_hold.as_millis(),
        "kept for the rest of min_hold: pttl {pttl} ms"
    );
}
