use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "point:<x>")]
fn point((x, y): (i32, i32)) -> Result<i32, LockError> {
    Ok(x + y)
}

fn main() {
    let _ = point((1, 2));
}
