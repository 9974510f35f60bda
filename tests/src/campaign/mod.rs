//! A randomized fault campaign in the manner of Jepsen: worker processes (`campaign_worker`) run a
//! mixed lock workload and record every call ([`record`]), a nemesis injects faults at random,
//! overlapping times and logs each one, and a checker that knows nothing of the lock library
//! ([`check`]) decides from the records alone whether the history keeps the library's promises.

pub mod check;
pub mod clock;
pub mod nemesis;
pub mod record;
pub mod run;
pub mod workload;
