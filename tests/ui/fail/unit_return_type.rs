use lock_runtime::distributed_lock;

#[distributed_lock(key = "report:<day>")]
async fn build_report(day: &str) -> () {
    println!("{day}");
}

fn main() {
    let _ = build_report("monday");
}
