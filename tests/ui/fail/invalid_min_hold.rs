use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "job:<day>", min_hold = "30 seconds or so")]
fn nightly(day: &str) -> Result<(), LockError> {
    let _ = day;
    Ok(())
}

fn main() {
    let _ = nightly("2026-11-29");
}
