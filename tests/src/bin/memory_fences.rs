//! Test helper for `tests/clock_faults.rs`: fencing tokens of the in-memory backend across a step
//! of this process's wall clock (made by the test through libfaketime).
//!
//! Usage: `memory_fences <go-file>`. Takes lock `a` twice and prints `before a=<token>
//! wall_ms=<ms>`; once the go file exists (polled every 5 ms, at most 60 s) takes `a` again and a
//! new lock `b`, and prints `after a=<token> b=<token> wall_ms=<ms>`. Exits with 0, 2 on bad
//! arguments, 3 on a lock error.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_runtime::{LockClient, LockConfig, LockError};

fn token(client: &LockClient, name: &str) -> Result<u64, LockError> {
    let guard = client.lock(name).acquire_blocking()?;
    let token = guard.fencing_token().unwrap_or(0);
    guard.release_blocking()?;
    Ok(token)
}

fn wall_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn run(go: &Path) -> Result<(), LockError> {
    let client = LockClient::new(LockConfig::in_memory())?;
    token(&client, "a")?;
    println!("before a={} wall_ms={}", token(&client, "a")?, wall_ms());
    let started = Instant::now();
    while !go.exists() && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let a = token(&client, "a")?;
    let b = token(&client, "b")?;
    println!("after a={a} b={b} wall_ms={}", wall_ms());
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [go] = args.as_slice() else {
        eprintln!("usage: memory_fences <go-file>");
        return ExitCode::from(2);
    };
    match run(Path::new(go)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("memory_fences: {err}");
            ExitCode::from(3)
        }
    }
}
