use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "user:<name.to_lowercase()>")]
fn greet(name: &str) -> Result<String, LockError> {
    Ok(format!("hello {name}"))
}

fn main() {
    let _ = greet("ada");
}
