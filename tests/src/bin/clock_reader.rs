//! Test helper for `tests/harness.rs`: two threads print `CLOCK_MONOTONIC` readings
//! (`lock_tests::now_ns`, one per line) as fast as they can, for at most the seconds given
//! (default 10), so that a test can check that no reading falls inside a recorded pause.
//!
//! Usage: `clock_reader [seconds]`. Exits with 0 when the time is up or stdout is closed.

use std::io::Write as _;
use std::time::{Duration, Instant};

use lock_tests::history::now_ns;

fn read_until(deadline: Instant) {
    let mut out = std::io::stdout();
    while Instant::now() < deadline {
        if writeln!(out, "{}", now_ns()).is_err() {
            return;
        }
    }
}

fn main() {
    let secs = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let other = std::thread::spawn(move || read_until(deadline));
    read_until(deadline);
    let _ = other.join();
}
