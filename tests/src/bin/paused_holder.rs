//! Test helper for `tests/holder_processes.rs`: takes one lock (ttl 1s), says so, and holds it
//! until a file appears, so that the test can SIGSTOP it past its ttl, resume it and then let it
//! finish.
//!
//! Usage: `paused_holder <redis-url> <key> <go-file> <mode>`, mode one of
//! - `guard`: `acquire_blocking`, then after the go file appeared print `is_lost=<bool>` and
//!   release (`release_blocking`);
//! - `sync`: a sync `#[distributed_lock]` fn whose body waits for the go file;
//! - `async`: an async `#[distributed_lock]` fn whose body waits for the go file.
//!
//! Prints `acquired fence=<n>` once the lock is held, then one `outcome=<what>` line: `ok`, `lost`,
//! `unavailable`, or `other` (with the error on stderr). The body polls for the go file every 5 ms
//! for at most 60 s. Exits with 0 after the outcome line, 2 on bad arguments.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use lock_runtime::{LockConfig, LockError, distributed_lock};

const GO_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(5);

fn say(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}").and_then(|()| stdout.flush());
}

/// Says that `guard` holds the lock, with its fencing token.
fn say_acquired(guard: &lock_runtime::LockGuard) {
    say(&format!(
        "acquired fence={}",
        guard.fencing_token().unwrap_or(0)
    ));
}

/// Whether the go file appeared (or the bound passed) since `started`.
fn went(go: &Path, started: Instant) -> bool {
    go.exists() || started.elapsed() > GO_TIMEOUT
}

/// Blocks this thread until the go file appears (or the bound passes).
fn wait_for_go(go: &Path) {
    let started = Instant::now();
    while !went(go, started) {
        std::thread::sleep(POLL);
    }
}

#[distributed_lock(key = "<key>", ttl = "1s", guard = held)]
fn sync_body(key: &str, go: &Path) -> Result<(), LockError> {
    say_acquired(held);
    wait_for_go(go);
    Ok(())
}

#[distributed_lock(key = "<key>", ttl = "1s", guard = held)]
async fn async_body(key: &str, go: &Path) -> Result<(), LockError> {
    say_acquired(held);
    let started = Instant::now();
    while !went(go, started) {
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

fn guard_mode(url: &str, key: &str, go: &Path) -> Result<(), LockError> {
    let client = lock_runtime::LockClient::new(LockConfig::single(url).fencing(true))?;
    let guard = client
        .lock(key)
        .ttl(Duration::from_secs(1))
        .acquire_blocking()?;
    say_acquired(&guard);
    wait_for_go(go);
    say(&format!("is_lost={}", guard.is_lost()));
    guard.release_blocking()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, key, go, mode] = args.as_slice() else {
        eprintln!("usage: paused_holder <redis-url> <key> <go-file> <guard|sync|async>");
        return ExitCode::from(2);
    };
    let go = Path::new(go);
    let outcome = match mode.as_str() {
        "guard" => guard_mode(url, key, go),
        "sync" | "async" => {
            if let Err(err) = lock_runtime::init(LockConfig::single(url.as_str()).fencing(true)) {
                eprintln!("paused_holder: {err}");
                return ExitCode::from(2);
            }
            if mode == "sync" {
                sync_body(key, go)
            } else {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(async_body(key, go)),
                    Err(err) => {
                        eprintln!("paused_holder: tokio runtime: {err}");
                        return ExitCode::from(2);
                    }
                }
            }
        }
        _ => {
            eprintln!("paused_holder: unknown mode {mode:?}");
            return ExitCode::from(2);
        }
    };
    let word = match &outcome {
        Ok(()) => "ok",
        Err(LockError::Lost { .. }) => "lost",
        Err(LockError::Unavailable { .. }) => "unavailable",
        Err(_) => "other",
    };
    if let Err(err) = &outcome {
        eprintln!("paused_holder: {err}");
    }
    say(&format!("outcome={word}"));
    lock_runtime::shutdown();
    ExitCode::SUCCESS
}
