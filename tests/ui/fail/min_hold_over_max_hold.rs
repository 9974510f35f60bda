use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "job:<day>", max_hold = "10s", min_hold = "30s")]
async fn nightly(day: &str) -> Result<(), LockError> {
    let _ = day;
    Ok(())
}

fn main() {
    let _ = nightly("2026-11-29");
}
