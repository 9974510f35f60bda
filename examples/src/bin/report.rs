//! A long sync job guarded by a short TTL: renewal keeps the lock for as long as the job runs, and
//! a second instance that starts meanwhile skips the job instead of running it twice.
//!
//! ```text
//! cargo run -p lock-examples --bin report                      # in-memory locks, two threads
//! LOCK_REDIS_URL=redis://127.0.0.1:6379/ cargo run -p lock-examples --bin report   # run it twice at once
//! ```

use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lock_runtime::{LockConfig, LockError, distributed_lock};

/// Takes `steps` x 400ms, several times the 1s TTL. `guard` shows the lock from inside.
#[distributed_lock(key = "report:<day>", ttl = "1s", guard = lock)]
fn build_report(day: &str, steps: u32, started: &mpsc::Sender<()>) -> Result<String, LockError> {
    let _ = started.send(());
    for step in 1..=steps {
        std::thread::sleep(Duration::from_millis(400)); // the work
        if lock.is_lost() {
            // The call will return Err(Lost) anyway; stopping early avoids wasted work.
            break;
        }
        println!(
            "  step {step}/{steps}: still holding {} (fencing token {:?})",
            lock.key(),
            lock.fencing_token()
        );
    }
    Ok(format!("report for {day}"))
}

fn main() -> ExitCode {
    let config = LockConfig::from_env_or(LockConfig::in_memory());
    println!("lock backend: {config:?}");
    if let Err(err) = lock_runtime::init(config) {
        eprintln!("report: {err}");
        return ExitCode::FAILURE;
    }
    let day = "2026-11-29";
    let (started_tx, started_rx) = mpsc::channel();
    let first = std::thread::spawn(move || {
        let start = Instant::now();
        let result = build_report(day, 6, &started_tx);
        (result, start.elapsed())
    });
    // The second instance starts once the first holds the lock (or gave up trying).
    let _ = started_rx.recv_timeout(Duration::from_secs(10));
    let (never_tx, _) = mpsc::channel();
    match build_report(day, 6, &never_tx) {
        Err(err @ LockError::Contended { .. }) => println!("second instance: skipping ({err})"),
        Ok(report) => println!("second instance built it: {report}"),
        Err(err) => println!("second instance failed: {err}"),
    }
    let first = first.join();
    // Before exiting: release what is still held and let releases in flight reach Redis.
    lock_runtime::shutdown();
    match first {
        Ok((Ok(report), took)) => {
            println!("first instance: {report} in {took:.1?}, past its 1s TTL thanks to renewal");
            ExitCode::SUCCESS
        }
        Ok((Err(err), _)) => {
            eprintln!("first instance: {err}");
            ExitCode::FAILURE
        }
        Err(_) => ExitCode::FAILURE,
    }
}
