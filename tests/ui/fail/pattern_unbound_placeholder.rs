use lock_runtime::{LockError, distributed_lock};

pub struct Query<T>(pub T);

pub struct Params {
    pub page: u32,
    pub per_page: u32,
}

pub struct Point {
    pub x: i32,
    pub y: i32,
}

// Only what a pattern binds is a name: `..` leaves `per_page` unbound, `_` binds nothing, and
// `y: why` binds `why`, not `y`.
#[distributed_lock(key = "list:<per_page>:<amount>:<y>")]
pub fn list(
    Query(Params { page, .. }): Query<Params>,
    (user, _): (u64, i64),
    Point { x, y: why }: Point,
) -> Result<String, LockError> {
    Ok(format!("{page} {user} {x} {why}"))
}

fn main() {}
