//! A cron-style job on two instances whose timers fire 300 ms apart: the job takes 200 ms, so
//! without `min_hold` the second instance finds the lock free again and runs it a second time;
//! with `min_hold` the first run keeps the lock for a while after it finished, and the second
//! instance skips the tick.
//!
//! ```text
//! cargo run -p lock-examples --bin cron                                            # in memory
//! LOCK_REDIS_URL=redis://127.0.0.1:6379/ cargo run -p lock-examples --bin cron     # two clients
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_runtime::{LockClient, LockConfig, LockError};

/// How far apart the instances' timers fire.
const SKEW: Duration = Duration::from_millis(300);

/// One tick of the job on one instance: runs it under the lock, or skips it if another instance
/// holds it (or held it less than `min_hold` ago).
async fn tick(
    instance: &str,
    client: &LockClient,
    key: &str,
    min_hold: Option<Duration>,
    runs: &AtomicUsize,
) -> Result<(), LockError> {
    let lock = client.lock(key).ttl(Duration::from_secs(10));
    let lock = match min_hold {
        Some(min_hold) => lock.min_hold(min_hold),
        None => lock,
    };
    let ran = lock
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await; // the job
            Ok::<_, LockError>(())
        })
        .await;
    match ran {
        Ok(()) => println!("  {instance}: ran the job"),
        Err(LockError::Contended { .. }) => println!("  {instance}: skipped, already done"),
        Err(err) => return Err(err),
    }
    Ok(())
}

/// Both instances fire for `key`, the second `SKEW` after the first; returns how many ran it.
async fn both_fire(
    a: &LockClient,
    b: &LockClient,
    key: &str,
    min_hold: Option<Duration>,
) -> Result<usize, LockError> {
    let runs = Arc::new(AtomicUsize::new(0));
    let first = tick("instance a", a, key, min_hold, &runs);
    let second = async {
        tokio::time::sleep(SKEW).await; // b's timer fires later
        tick("instance b", b, key, min_hold, &runs).await
    };
    let (first, second) = tokio::join!(first, second);
    first.and(second)?;
    Ok(runs.load(Ordering::SeqCst))
}

#[tokio::main]
async fn main() -> ExitCode {
    let config = LockConfig::from_env_or(LockConfig::in_memory());
    println!("lock backend: {config:?}");
    // Two instances: two clients of one Redis (in memory, where clients share nothing, one).
    let clients = LockClient::new(config.clone()).and_then(|a| {
        let b = match std::env::var_os("LOCK_REDIS_URL") {
            Some(_) => LockClient::new(config)?,
            None => a.clone(),
        };
        Ok((a, b))
    });
    let (a, b) = match clients {
        Ok(clients) => clients,
        Err(err) => {
            eprintln!("cron: {err}");
            return ExitCode::FAILURE;
        }
    };
    let tick_id = std::process::id();
    println!("without min_hold:");
    let without = both_fire(&a, &b, &format!("cron:report:{tick_id}:plain"), None).await;
    println!("with min_hold = 5s:");
    let min_hold = Some(Duration::from_secs(5));
    let with = both_fire(&a, &b, &format!("cron:report:{tick_id}:kept"), min_hold).await;
    // The kept lock is left to expire by itself: shutdown does not delete it. Shutdown blocks:
    // off the runtime's threads.
    let _ = tokio::task::spawn_blocking(move || {
        a.shutdown();
        b.shutdown();
    })
    .await;
    match (without, with) {
        (Ok(without), Ok(1)) => {
            println!("ran {without} time(s) without min_hold, once with it");
            ExitCode::SUCCESS
        }
        (Ok(_), Ok(n)) => {
            eprintln!("cron: the job ran {n} times with min_hold");
            ExitCode::FAILURE
        }
        (Err(err), _) | (_, Err(err)) => {
            eprintln!("cron: {err}");
            ExitCode::FAILURE
        }
    }
}
