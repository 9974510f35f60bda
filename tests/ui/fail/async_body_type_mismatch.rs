use lock_runtime::{LockError, distributed_lock};

// Same for async bodies.
#[distributed_lock(key = "count:<text>")]
async fn count(text: &str) -> Result<usize, LockError> {
    text.len()
}

fn main() {
    let _ = count("1");
}
