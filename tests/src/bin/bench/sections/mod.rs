//! The sections of the bench, one module each, named as `--only` names them (numbered as in the
//! binary's doc).

pub(crate) mod contended;
pub(crate) mod handoff;
pub(crate) mod held;
pub(crate) mod memory;
pub(crate) mod multi;
pub(crate) mod pairs;
pub(crate) mod redlock;
pub(crate) mod topology;
