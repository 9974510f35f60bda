use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "jobs:<day>", permits = 0)]
fn no_permits(day: u32) -> Result<(), LockError> {
    let _ = day;
    Ok(())
}

#[distributed_lock(key = "cache:<id>", shared = true, permits = 2)]
fn shared_semaphore(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "queue:<id>", fair = true, shared = true)]
fn fair_reader(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(keys = ["a:<x>", "b:<x>"], fair = true)]
fn fair_pair(x: u32) -> Result<(), LockError> {
    let _ = x;
    Ok(())
}

#[distributed_lock(key = "jobs:<day>", permits = "3", shared = 1)]
fn bad_values(day: u32) -> Result<(), LockError> {
    let _ = day;
    Ok(())
}

fn main() {
    let _ = (no_permits(1), shared_semaphore(1), fair_reader(1), fair_pair(1), bad_values(1));
}
