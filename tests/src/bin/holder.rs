//! Test helper for `tests/processes.rs`, `tests/holder_processes.rs` and others: takes one lock
//! and holds it until killed.
//!
//! Usage: `holder <redis-url> <key> <ttl-ms> [kind]`. Prints `acquired fence=<n>` on stdout once the
//! lock is held (the renewal driver keeps it alive from then on), then sleeps until the process is
//! killed. With a `kind` (`write`, `fair`, `read`, `permits=N`, as in `lock_tests::sections::Kind`)
//! it takes the lock as that kind and waits up to 60 s for it (a fair waiter queues meanwhile);
//! without, it tries once.
//! With `LOCK_ETCD_ENDPOINTS` set, the lock is taken on etcd instead (`LockConfig::from_env`).
//! Exits with 2 on bad arguments, 3 when the lock cannot be taken.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use lock_runtime::{LockClient, LockConfig};
use lock_tests::sections::Kind;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, key, ttl_ms, kind) = match args.as_slice() {
        [url, key, ttl_ms] => (url, key, ttl_ms, None),
        [url, key, ttl_ms, kind] => match kind.parse::<Kind>() {
            Ok(kind) => (url, key, ttl_ms, Some(kind)),
            Err(err) => {
                eprintln!("holder: {err}");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("usage: holder <redis-url> <key> <ttl-ms> [kind]");
            return ExitCode::from(2);
        }
    };
    let Ok(ttl_ms) = ttl_ms.parse::<u64>() else {
        eprintln!("holder: ttl-ms must be a number of milliseconds");
        return ExitCode::from(2);
    };
    // With LOCK_ETCD_ENDPOINTS set, the lock lives on etcd and `redis-url` is ignored.
    let config = if std::env::var_os(lock_runtime::ENV_ETCD_ENDPOINTS).is_some() {
        LockConfig::from_env()
    } else {
        LockConfig::single(url.as_str()).fencing(true)
    };
    let client = match LockClient::new(config) {
        Ok(client) => client,
        Err(err) => {
            eprintln!("holder: {err}");
            return ExitCode::from(2);
        }
    };
    let lock = client.lock(key.as_str()).ttl(Duration::from_millis(ttl_ms));
    let lock = match kind {
        None => lock,
        Some(kind) => kind.apply(lock.wait(Duration::from_secs(60))),
    };
    let guard = match lock.acquire_blocking() {
        Ok(guard) => guard,
        Err(err) => {
            eprintln!("holder: {err}");
            return ExitCode::from(3);
        }
    };
    let fence = guard.fencing_token().unwrap_or(0);
    let mut stdout = std::io::stdout().lock();
    if writeln!(stdout, "acquired fence={fence}")
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::from(3);
    }
    drop(stdout);
    // Held (and renewed in the background) until SIGKILL; the guard is never dropped.
    loop {
        std::thread::sleep(Duration::from_secs(3600));
        if guard.is_lost() {
            eprintln!("holder: lock lost");
        }
    }
}
