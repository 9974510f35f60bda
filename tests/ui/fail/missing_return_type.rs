use lock_runtime::distributed_lock;

#[distributed_lock(key = "report:<day>")]
fn build_report(day: &str) {
    println!("{day}");
}

fn main() {
    build_report("monday");
}
