//! Test helper for `tests/shutdown.rs`: starts releases, calls `lock_runtime::shutdown()`, and
//! exits at once.
//!
//! Usage: `shutdown_worker <redis-url> <held-key> <dropped-key> <cancelled-key>`. Through the
//! process-wide client (`init`, ttl 30 s), takes `held-key` and `dropped-key` and prints
//! `acquired`; then cancels an acquire of `cancelled-key` after 20 ms (its request is on the
//! wire, its grant lands after the cancellation), drops the guard of `dropped-key` (its release
//! starts in the background), prints `shutting down`, and calls `shutdown()` with the guard of
//! `held-key` still held. Prints `shutdown took=<ms> lost=<bool> refused=<bool>` (how long
//! `shutdown()` blocked, whether the held guard reports its lock lost, whether a lock call after
//! it is refused with `Runtime`) and exits with 0 at once, running no destructor.
//! Exits with 2 on bad arguments, 3 when a lock cannot be taken.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use lock_runtime::{Lock, LockConfig, LockError};

fn say(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}").and_then(|()| stdout.flush());
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, held, dropped, cancelled] = args.as_slice() else {
        eprintln!("usage: shutdown_worker <redis-url> <held-key> <dropped-key> <cancelled-key>");
        return ExitCode::from(2);
    };
    let config = LockConfig::single(url.as_str()).default_ttl(Duration::from_secs(30));
    if let Err(err) = lock_runtime::init(config) {
        eprintln!("shutdown_worker: {err}");
        return ExitCode::from(2);
    }
    let (held, dropped) = match (
        Lock::new(held.as_str()).acquire_blocking(),
        Lock::new(dropped.as_str()).acquire_blocking(),
    ) {
        (Ok(held), Ok(dropped)) => (held, dropped),
        (Err(err), _) | (_, Err(err)) => {
            eprintln!("shutdown_worker: {err}");
            return ExitCode::from(3);
        }
    };
    say("acquired");
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::from(2);
    };
    let attempt = runtime.block_on(async {
        tokio::time::timeout(
            Duration::from_millis(20),
            Lock::new(cancelled.as_str()).acquire(),
        )
        .await
    });
    if attempt.is_ok() {
        eprintln!("shutdown_worker: the acquire of {cancelled} finished within 20 ms");
        return ExitCode::from(3);
    }
    drop(dropped);
    say("shutting down");
    let started = Instant::now();
    lock_runtime::shutdown();
    let took = started.elapsed();
    let refused = matches!(
        Lock::new(format!("{cancelled}:after")).acquire_blocking(),
        Err(LockError::Runtime { .. })
    );
    say(&format!(
        "shutdown took={} lost={} refused={refused}",
        took.as_millis(),
        held.is_lost()
    ));
    // Exit now: no destructor (the held guard's included) gets a chance to release anything.
    std::process::exit(0);
}
