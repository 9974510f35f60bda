use lock_runtime::{LockError, distributed_lock};

pub struct User {
    pub id: u64,
    pub name: String,
}

pub struct Store {
    shard: u32,
}

// rustc, not the macro, knows the fields, so rustc reports a misspelt one, on the key. Where the
// compiler gives the placeholder's own span (nightly), its "a field with a similar name exists"
// fix edits the name inside the template; here, on stable, there is no fix rather than one that
// replaces the whole template with the field's name.
#[distributed_lock(key = "user:<u.idd>")]
pub fn rename(u: User) -> Result<String, LockError> {
    Ok(u.name)
}

impl Store {
    #[distributed_lock(key = "store:<self.shrad>")]
    pub async fn compact(&self) -> Result<u32, LockError> {
        Ok(self.shard)
    }
}

fn main() {}
