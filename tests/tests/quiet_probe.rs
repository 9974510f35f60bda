//! Asking a caller's runtime whether it has IO and time drivers panics inside the library when it
//! has not (tokio cannot be asked otherwise); that panic is caught and never reaches the
//! process's panic hook, which still sees every other panic. Alone in its binary: it sets the
//! panic hook, which is global.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_runtime::{LockClient, LockConfig};
use lock_tests::{RedisServer, unique_key};

#[test]
fn asking_a_runtime_without_io_reports_no_panic_and_other_panics_still_are() {
    let reported = Arc::new(AtomicUsize::new(0));
    let hook_saw = Arc::clone(&reported);
    std::panic::set_hook(Box::new(move |_| {
        hook_saw.fetch_add(1, Ordering::SeqCst);
    }));
    let server = RedisServer::start();
    let client = LockClient::new(LockConfig::single(server.url())).unwrap();
    let key = unique_key("quiet");
    for runtime in [
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap(),
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_io()
            .build()
            .unwrap(),
    ] {
        runtime
            .block_on(async {
                for _ in 0..2 {
                    let guard = client
                        .lock(&key)
                        .wait(Duration::from_secs(2))
                        .acquire()
                        .await?;
                    guard.release().await?;
                }
                Ok::<_, lock_runtime::LockError>(())
            })
            .unwrap();
    }
    assert_eq!(reported.load(Ordering::SeqCst), 0, "the probe's panics");
    let other = std::thread::spawn(|| panic!("another panic")).join();
    assert!(other.is_err());
    assert_eq!(
        reported.load(Ordering::SeqCst),
        1,
        "a panic elsewhere still reaches the hook"
    );
}
