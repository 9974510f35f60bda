// `map_err = path`: a lock failure becomes whatever error type the function returns, through a
// `fn(LockError) -> E`, for error types that cannot have `From<LockError>` (a foreign type: the
// orphan rule). On sync and async fns, with `key` and `keys`, with a free fn, an associated fn and
// a tuple variant.
use lock_runtime::{LockConfig, LockError, distributed_lock};

// Stands for a foreign error type (a framework's): no `From<LockError>`.
#[derive(Debug, PartialEq)]
struct Status {
    code: u8,
    message: String,
}

fn to_status(err: LockError) -> Status {
    Status {
        code: if err.is_contended() { 10 } else { 13 },
        message: err.to_string(),
    }
}

impl Status {
    fn from_lock(err: LockError) -> Self {
        to_status(err)
    }
}

#[derive(Debug)]
enum JobError {
    Lock(LockError),
}

#[distributed_lock(key = "job:<id>", map_err = to_status)]
fn sync_job(id: u32) -> Result<u32, Status> {
    Ok(id)
}

#[distributed_lock(keys = ["a:<x>", "b:<y>"], map_err = Status::from_lock)]
async fn async_job(x: u32, y: u32) -> Result<u32, Status> {
    Ok(x + y)
}

#[distributed_lock(key = "job:<id>", map_err = JobError::Lock, reentrant = false)]
fn variant_job(id: u32) -> Result<u32, JobError> {
    Ok(id)
}

// Holds `job:1` and calls the non-reentrant `variant_job(1)`: contended, mapped by the variant.
#[distributed_lock(key = "job:<id>", map_err = to_status)]
fn nested(id: u32) -> Result<Result<u32, JobError>, Status> {
    Ok(variant_job(id))
}

fn main() {
    lock_runtime::init(LockConfig::in_memory()).unwrap();
    assert_eq!(sync_job(1), Ok(1));
    match nested(1) {
        Ok(Err(JobError::Lock(err))) => assert!(err.is_contended(), "{err:?}"),
        other => panic!("expected contention, got {other:?}"),
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    assert_eq!(runtime.block_on(async_job(1, 2)), Ok(3));
}
