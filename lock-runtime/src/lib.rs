//! Distributed locks on Redis behind one attribute.
//!
//! (Crate documentation is completed with the attribute; see README.md.)

mod client;
mod config;
mod error;
mod global;
mod guard;
mod lock;
mod renew;
mod scripts;
mod wait;

#[doc(hidden)]
pub mod __private;

pub use client::LockClient;
pub use config::{ENV_URL, LockConfig};
pub use error::{FailureKind, LockError, NodeFailure};
pub use global::init;
pub use guard::LockGuard;
pub use lock::Lock;
pub use lock_macros::distributed_lock;
