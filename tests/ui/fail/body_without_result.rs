use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
pub struct ReportError;

impl From<LockError> for ReportError {
    fn from(_: LockError) -> Self {
        ReportError
    }
}

fn build() {}

// A body that ends without its `Result` is reported on the body, as in a plain fn, not on the
// attribute or the return type; rustc's "remove this semicolon" help still applies.
#[distributed_lock(key = "report")]
fn build_report() -> Result<(), ReportError> {
    build();
}

#[distributed_lock(key = "report:async")]
async fn build_report_async() -> Result<(), ReportError> {
    build();
    Ok(());
}

fn main() {
    let _ = build_report();
    let _ = build_report_async();
}
