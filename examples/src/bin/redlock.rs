//! Redlock over independent Redis masters: the same attribute, a different `init`.
//!
//! ```text
//! for p in 7001 7002 7003; do redis-server --port $p --save '' --daemonize yes; done
//! LOCK_REDIS_URL=redis://127.0.0.1:7001/,redis://127.0.0.1:7002/,redis://127.0.0.1:7003/ \
//!     cargo run -p lock-examples --bin redlock
//! ```
//!
//! Stop one of the three servers and run it again: it still works (a majority is enough). Stop two
//! and it reports `Unavailable`, naming each node that failed, never `Contended`.

use std::process::ExitCode;

use lock_runtime::{LockConfig, LockError, distributed_lock};

/// Held on a majority of the nodes while the body runs. No fencing token in Redlock mode.
#[distributed_lock(key = "nightly-job:<name>", ttl = "5s", guard = lock)]
async fn run_job(name: &str) -> Result<String, LockError> {
    Ok(format!(
        "{name} ran under {} (fencing token: {:?})",
        lock.key(),
        lock.fencing_token()
    ))
}

#[tokio::main]
async fn main() -> ExitCode {
    let config = LockConfig::from_env();
    println!("lock backend: {config:?}");
    if let Err(err) = lock_runtime::init(config) {
        eprintln!(
            "redlock: {err}\nset LOCK_REDIS_URL to a comma-separated list of redis:// URLs (see the file's docs)"
        );
        return ExitCode::FAILURE;
    }
    // Two instances start the job at once: exactly one runs it.
    let (a, b) = tokio::join!(run_job("compaction"), run_job("compaction"));
    // Before exiting: release what is still held and let releases in flight reach Redis.
    lock_runtime::shutdown();
    for outcome in [a, b] {
        match outcome {
            Ok(report) => println!("ran: {report}"),
            Err(err @ LockError::Contended { .. }) => println!("skipped: {err}"),
            Err(err) => {
                eprintln!("failed: {err}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
