use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "report:<day>", min_hold = "2years")]
fn report(day: u32) -> Result<u32, LockError> {
    Ok(day)
}

fn main() {
    let _ = report(1);
}
