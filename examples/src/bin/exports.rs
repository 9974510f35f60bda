//! A semaphore: at most two heavy exports run at once across every instance of the service, and a
//! reader/writer lock: many requests read the price list at once while a refresh waits for them
//! and then has it alone.
//!
//! ```text
//! cargo run -p lock-examples --bin exports                    # in-memory locks, one process
//! LOCK_REDIS_URL=redis://127.0.0.1:6379/ cargo run -p lock-examples --bin exports   # run it in two terminals
//! ```
//!
//! With Redis, start it twice at once: the two processes together still run at most two exports
//! at a time (each permit is a lease of its own, renewed while its export runs, freed on return,
//! on a panic, on cancellation, or within its ttl if the process dies).

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_runtime::{LockConfig, LockError, distributed_lock};

/// Exports running in this process right now, and the most seen at once.
static RUNNING: AtomicUsize = AtomicUsize::new(0);
static MOST: AtomicUsize = AtomicUsize::new(0);

/// One of two permits for the whole service; waits up to a minute for one.
#[distributed_lock(key = "exports", permits = 2, ttl = "5s", wait = "60s", guard = permit)]
async fn export(customer: u32) -> Result<usize, LockError> {
    let now = RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
    MOST.fetch_max(now, Ordering::SeqCst);
    println!(
        "  export for customer {customer}: running ({now} here), permit fencing token {:?}",
        permit.fencing_token()
    );
    tokio::time::sleep(Duration::from_millis(300)).await; // the heavy work
    RUNNING.fetch_sub(1, Ordering::SeqCst);
    Ok(1000 + customer as usize)
}

/// Readers share the lock; they wait while a refresh holds it or waits for it.
#[distributed_lock(key = "prices", shared = true, ttl = "5s", wait = "10s")]
async fn price_of(item: u32) -> Result<u32, LockError> {
    tokio::time::sleep(Duration::from_millis(50)).await; // reading the cached list
    Ok(item * 3)
}

/// The writer: new readers wait behind it, so a stream of readers cannot starve it.
#[distributed_lock(key = "prices", ttl = "5s", wait = "10s")]
async fn refresh_prices() -> Result<(), LockError> {
    println!("  refreshing the price list (no reader inside)");
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let config = LockConfig::from_env_or(LockConfig::in_memory());
    println!("lock backend: {config:?}");
    if let Err(err) = lock_runtime::init(config) {
        eprintln!("exports: {err}");
        return ExitCode::FAILURE;
    }

    println!("six exports, two permits:");
    let exports: Vec<_> = (1..=6).map(|c| tokio::spawn(export(c))).collect();
    let mut failed = false;
    for job in exports {
        match job.await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => {
                eprintln!("  export failed: {err}");
                failed = true;
            }
            Err(err) => {
                eprintln!("  export task: {err}");
                failed = true;
            }
        }
    }
    println!(
        "  at most {} exports ran at once here",
        MOST.load(Ordering::SeqCst)
    );

    println!("readers and a refresh:");
    let readers: Vec<_> = (1..=4).map(|i| tokio::spawn(price_of(i))).collect();
    let refreshed = refresh_prices().await;
    let mut prices = Vec::new();
    for reader in readers {
        match reader.await {
            Ok(Ok(price)) => prices.push(price),
            Ok(Err(err)) => {
                eprintln!("  reader failed: {err}");
                failed = true;
            }
            Err(err) => {
                eprintln!("  reader task: {err}");
                failed = true;
            }
        }
    }
    if let Err(err) = refreshed {
        eprintln!("  refresh failed: {err}");
        failed = true;
    }
    println!("  prices read: {prices:?}");

    lock_runtime::shutdown();
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
