//! Test helper for `tests/shutdown.rs` and `tests/election.rs`: a waiter with a place in a
//! lock's queue, in a process that calls `lock_runtime::shutdown()` and exits.
//!
//! Usage: `queued_worker <redis-url> <key> <fair|default|campaign> [stay]`. Through the process-wide
//! client (`init`, ttl 30 s), waits for `key` (held by someone else) on a thread of its own:
//! a fair lock, a default lock (which queues once it starves), or a campaign for the election
//! `key`, each waiting up to a minute. Once `inspect` counts a waiter in the key's queue it
//! prints `queued`, calls `shutdown()`, and prints `shutdown took=<ms> waiter=<outcome>` (how
//! long `shutdown()` blocked; `stopped` when the waiter had answered `Runtime` by its return,
//! else `waiting` or what it answered) and exits with 0 at once, running no destructor. With
//! `stay` it prints `queued` and waits on (for a SIGKILL) instead.
//! Exits with 2 on bad arguments, 3 when it never queues.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lock_runtime::{Election, Lock, LockConfig, LockError};

/// How long the waiter waits, and how long this waits for it to queue.
const WAIT: Duration = Duration::from_secs(60);
const QUEUE_WITHIN: Duration = Duration::from_secs(10);

fn say(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}").and_then(|()| stdout.flush());
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, key, kind, stay) = match args.as_slice() {
        [url, key, kind] => (url, key, kind, false),
        [url, key, kind, stay] if stay == "stay" => (url, key, kind, true),
        _ => {
            eprintln!("usage: queued_worker <redis-url> <key> <fair|default|campaign> [stay]");
            return ExitCode::from(2);
        }
    };
    let config = LockConfig::single(url.as_str()).default_ttl(Duration::from_secs(30));
    if let Err(err) = lock_runtime::init(config) {
        eprintln!("queued_worker: {err}");
        return ExitCode::from(2);
    }
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::from(2);
    };
    let (tx, answered) = mpsc::channel();
    let (waiter_key, kind) = (key.clone(), kind.clone());
    std::thread::spawn(move || {
        let outcome: Result<(), LockError> = match kind.as_str() {
            "fair" => Lock::new(waiter_key)
                .fair(true)
                .wait(WAIT)
                .acquire_blocking()
                .map(drop),
            "default" => Lock::new(waiter_key)
                .wait(WAIT)
                .acquire_blocking()
                .map(drop),
            _ => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| LockError::Runtime {
                    reason: e.to_string(),
                })
                .and_then(|rt| rt.block_on(Election::new(waiter_key).campaign()).map(drop)),
        };
        let _ = tx.send(outcome);
    });
    let queued_by = Instant::now() + QUEUE_WITHIN;
    loop {
        let queued = runtime
            .block_on(lock_runtime::inspect(key))
            .ok()
            .flatten()
            .is_some_and(|info| info.queued > 0);
        if queued {
            break;
        }
        if Instant::now() >= queued_by {
            eprintln!("queued_worker: not queued within {QUEUE_WITHIN:?}");
            return ExitCode::from(3);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    say("queued");
    if stay {
        // The waiter's answer, if it ever comes, ends the wait; a SIGKILL comes first.
        let _ = answered.recv();
        return ExitCode::from(3);
    }
    let started = Instant::now();
    lock_runtime::shutdown();
    let took = started.elapsed();
    // The waiter's thread hears its answer a moment after its work ended: scheduling slack.
    let waiter = match answered.recv_timeout(Duration::from_millis(250)) {
        Ok(Err(LockError::Runtime { .. })) => "stopped".to_owned(),
        Ok(other) => format!("{other:?}"),
        Err(_) => "waiting".to_owned(),
    };
    say(&format!(
        "shutdown took={} waiter={waiter}",
        took.as_millis()
    ));
    // Exit now: nothing else gets a chance to leave the queue.
    std::process::exit(0);
}
