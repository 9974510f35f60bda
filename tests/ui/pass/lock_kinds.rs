use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "report:<day>", permits = 3, wait = "1s")]
fn build_report(day: u32) -> Result<u32, LockError> {
    Ok(day)
}

#[distributed_lock(key = "cache:<id>", shared = true)]
async fn read_cache(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "cache:<id>", fair = true, shared = false, wait = "5s")]
async fn write_cache(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {
    let _ = build_report(1);
    let _ = read_cache(1);
    let _ = write_cache(1);
}
