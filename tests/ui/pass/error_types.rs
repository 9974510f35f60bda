// The error types services already return carry lock failures with no code of the user's:
// `std::io::Result` (the `LockError` is the inner error), `anyhow::Result`,
// `Box<dyn Error + Send + Sync>`, and (feature `tonic`) `tonic::Status`.
use lock_runtime::{LockConfig, LockError, distributed_lock};
use std::error::Error;

#[distributed_lock(key = "io:<id>", reentrant = false)]
fn io_job(id: u32) -> std::io::Result<u32> {
    Ok(id)
}

#[distributed_lock(key = "io:<id>")]
fn io_outer(id: u32) -> std::io::Result<std::io::Result<u32>> {
    Ok(io_job(id))
}

#[distributed_lock(key = "anyhow:<id>")]
async fn anyhow_job(id: u32) -> anyhow::Result<u32> {
    Ok(id)
}

#[distributed_lock(key = "boxed:<id>")]
fn boxed_job(id: u32) -> Result<u32, Box<dyn Error + Send + Sync>> {
    Ok(id)
}

#[distributed_lock(key = "grpc:<id>")]
async fn grpc_method(id: u32) -> Result<tonic::Response<u32>, tonic::Status> {
    Ok(tonic::Response::new(id))
}

fn main() {
    lock_runtime::init(LockConfig::in_memory()).unwrap();
    let inner = io_outer(1).unwrap().unwrap_err();
    assert_eq!(inner.kind(), std::io::ErrorKind::ResourceBusy);
    let lock = inner.get_ref().and_then(|e| e.downcast_ref::<LockError>());
    assert!(matches!(lock, Some(LockError::Contended { .. })), "{inner:?}");
    assert_eq!(boxed_job(2).unwrap(), 2);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    assert_eq!(runtime.block_on(anyhow_job(3)).unwrap(), 3);
    assert_eq!(runtime.block_on(grpc_method(4)).unwrap().into_inner(), 4);
}
