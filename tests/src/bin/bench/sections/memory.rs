//! Section 3: uncontended pairs/s of the in-memory backend, 1 task.

use std::fmt::Write as _;

use lock_runtime::{LockClient, LockConfig};

use crate::locker::Locker;
use crate::measure::pairs_per_sec;
use crate::report::Report;
use crate::{Bench, Res};

pub(crate) async fn run(bench: &Bench, report: &mut Report) -> Res<()> {
    let client = LockClient::new(bench.opts.config(LockConfig::in_memory()))?;
    let rate = pairs_per_sec(&Locker::Crate(client), 1, bench).await?;
    report.figure("memory.1.per_sec", rate.per_sec);
    report.figure("memory.1.cpu_us", rate.cpu_us);
    let _ = writeln!(
        report,
        "\n3. In-memory backend, uncontended acquire+release, 1 task: {:.0} pairs/s ({} per pair)",
        rate.per_sec,
        rate.cost()
    );
    Ok(())
}
