use lock_runtime::distributed_lock;

#[distributed_lock(key = "counter:<name>")]
fn count(name: &str) -> u64 {
    name.len() as u64
}

fn main() {
    let _ = count("x");
}
