//! Credentials on one Redis node: a wrong password, no password, an unknown user or a user
//! without rights on the lock keys is `Unavailable` (`Auth`, `Permission`) at once, not retried
//! for the wait and never `Contended`; and secrets (tokens, passwords) never show in `Debug`
//! output, errors or logs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lock_runtime::{FailureKind, LockConfig, LockGuard};
use lock_tests::{
    RedisServer, ServerOptions, bounded, capture, client, free_port, lock_keys, unavailable_causes,
    unique_key, wait_until_async,
};

fn get(admin: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(admin).unwrap()
}

#[tokio::test]
async fn wrong_password_is_an_auth_failure_not_contention() {
    let server = RedisServer::start_with(ServerOptions {
        requirepass: Some("correct-horse".into()),
        acl_rules: vec!["user narrow on >narrowpw ~other:* +@all".into()],
        ..ServerOptions::default()
    });
    let key = unique_key("faults:auth");
    let cases = [
        (
            "wrong password",
            format!("redis://:battery-staple@127.0.0.1:{}/", server.port()),
            FailureKind::Auth,
        ),
        (
            "no password",
            format!("redis://127.0.0.1:{}/", server.port()),
            FailureKind::Auth,
        ),
        (
            "unknown user",
            server.url_as("nobody", "x"),
            FailureKind::Auth,
        ),
        (
            "no permission on lock keys",
            server.url_as("narrow", "narrowpw"),
            FailureKind::Permission,
        ),
    ];
    for (what, url, kind) in cases {
        let locks = client(LockConfig::single(&url));
        let started = Instant::now();
        // A long wait: a credentials problem must not be retried until it runs out.
        let err = bounded(
            Duration::from_secs(15),
            what,
            locks.lock(&key).wait(Duration::from_secs(10)).acquire(),
        )
        .await
        .expect_err(what);
        let took = started.elapsed();
        eprintln!("{what}: {took:?} -> {err}");
        let found = unavailable_causes(&err);
        assert_eq!(found.len(), 1, "{what}: {found:?}");
        assert_eq!(found[0].kind, kind, "{what}: {found:?}");
        assert_eq!(
            found[0].node,
            format!("127.0.0.1:{}", server.port()),
            "{what}"
        );
        assert!(
            took < Duration::from_secs(5),
            "{what}: retried for {took:?}"
        );
        let shown = format!("{err} {err:?}");
        assert!(
            !shown.contains("battery-staple") && !shown.contains("narrowpw"),
            "{shown}"
        );
    }
    assert!(server.keys("lock:*").is_empty(), "{:?}", server.keys("*"));

    // The right password works.
    let locks = client(LockConfig::single(server.url()));
    locks
        .lock(&key)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn tokens_and_passwords_never_in_debug_or_logs() {
    capture::install();
    let password = "pw-7f3a9c-secret";
    let server = RedisServer::start_with(ServerOptions {
        requirepass: Some(password.into()),
        ..ServerOptions::default()
    });
    let mut admin = server.admin();
    let config = LockConfig::single(server.url()).default_ttl(Duration::from_secs(5));
    let locks = client(config.clone());
    let key = unique_key("faults:secrets");
    let mut tokens = Vec::new();
    let mut shown = vec![format!("{config:?}"), format!("{locks:?}")];

    // A held lock, and the contention error of a second attempt.
    let guard: LockGuard = locks
        .lock(&key)
        .ttl(Duration::from_millis(900))
        .acquire()
        .await
        .unwrap();
    tokens.push(get(&mut admin, &lock_keys(&key).lock).expect("token in redis"));
    shown.push(format!("{guard:?}"));
    let contended = locks.lock(&key).acquire().await.expect_err("contended");
    shown.push(format!("{contended:?}"));
    shown.push(contended.to_string());

    // A lost lock (logged by the renewal driver), and its Lost error.
    let () = redis::cmd("SET")
        .arg(lock_keys(&key).lock)
        .arg("intruder")
        .query(&mut admin)
        .unwrap();
    bounded(Duration::from_secs(5), "lost()", guard.lost()).await;
    shown.push(format!("{guard:?}"));
    let lost = guard.release().await.expect_err("lost");
    shown.push(format!("{lost:?}"));

    // A guard dropped while the server is frozen: the drop's release fails and is logged.
    let key2 = unique_key("faults:secrets");
    let guard = locks
        .lock(&key2)
        .ttl(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    tokens.push(get(&mut admin, &lock_keys(&key2).lock).expect("token in redis"));
    server.freeze();
    drop(guard);
    let wrong = LockConfig::single(format!(
        "redis://:{password}-nope@127.0.0.1:{}/",
        server.port()
    ));
    shown.push(format!("{wrong:?}"));
    let unavailable = client(LockConfig::single(format!(
        "redis://:{password}@127.0.0.1:{}/",
        free_port()
    )))
    .lock(&key2)
    .acquire()
    .await
    .expect_err("no server there");
    shown.push(format!("{unavailable:?}"));
    shown.push(unavailable.to_string());
    // The failed release on drop is logged: its event is among those checked for secrets below.
    wait_until_async(
        Duration::from_secs(5),
        "the failed drop-release logged",
        || capture::text().contains("release failed"),
    )
    .await;
    server.thaw();

    let text = capture::text();
    assert!(
        text.contains(&key),
        "the capture saw no event about {key}: the log check would be vacuous\n{text}"
    );
    eprintln!("captured {} log lines", text.lines().count());
    for value in &tokens {
        // The value is the token's secret (32 hex digits), then the owner record, which may
        // be shown: the secret may not.
        let secret = value
            .get(..32)
            .unwrap_or_else(|| panic!("a short value: {value:?}"));
        assert!(
            secret.bytes().all(|b| b.is_ascii_hexdigit()),
            "unexpected token format: {value:?}"
        );
        for s in &shown {
            assert!(!s.contains(secret), "token shown in {s}");
        }
        assert!(!text.contains(secret), "token in the logs");
    }
    for s in &shown {
        assert!(!s.contains(password), "password shown in {s}");
    }
    assert!(!text.contains(password), "password in the logs");
}
