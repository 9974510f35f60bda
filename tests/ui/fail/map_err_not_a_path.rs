use lock_runtime::distributed_lock;

#[derive(Debug)]
struct Status;

#[distributed_lock(key = "job:<id>", map_err = "to_status")]
fn job(id: u32) -> Result<u32, Status> {
    Ok(id)
}

fn main() {
    let _ = job(1);
}
