//! Compile-time behaviour of `#[distributed_lock]`: every supported shape compiles and runs
//! (`ui/pass`), and every misuse fails with its own message on the right span (`ui/fail`, one rule
//! per file). Regenerate `.stderr` files with `TRYBUILD=overwrite` and review the diff.
//! Compiler messages differ between channels, so this runs on stable only.

#[rustversion::attr(not(stable), ignore)]
#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("ui/pass/*.rs");
    t.compile_fail("ui/fail/*.rs");
}
