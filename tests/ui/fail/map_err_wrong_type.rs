use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct Status;

#[derive(Debug)]
struct OtherError;

fn to_other(_: LockError) -> OtherError {
    OtherError
}

#[distributed_lock(key = "job:<id>", map_err = to_other)]
async fn job(id: u32) -> Result<u32, Status> {
    Ok(id)
}

fn main() {
    let _ = job(1);
}
