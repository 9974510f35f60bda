//! Which `valkey-server` the Valkey tests run, or that they are skipped, said loudly.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Once;

/// A `valkey-server` binary of the user's own; `scripts/test.sh` sets it to the one it fetched.
const VALKEY_SERVER_ENV: &str = "LOCK_TESTS_VALKEY_SERVER";
/// `no`: `scripts/test.sh` fetches no `valkey-server`, and the Valkey tests are skipped unless
/// `LOCK_TESTS_VALKEY_SERVER` names one.
const VALKEY_FETCH_ENV: &str = "LOCK_TESTS_VALKEY_FETCH";

/// The `valkey-server` to run: `LOCK_TESTS_VALKEY_SERVER`. `None` (the caller skips its test) only
/// when that is unset and `LOCK_TESTS_VALKEY_FETCH` is `no`; this is then said once per test binary on
/// stderr, past the test harness's capture. Panics when neither is set: the Valkey tests must not
/// pass for having run nothing.
pub fn valkey_server() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(VALKEY_SERVER_ENV).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    if std::env::var_os(VALKEY_FETCH_ENV).is_some_and(|v| v == "no") {
        static SAID: Once = Once::new();
        SAID.call_once(|| {
            // Written to the process's stderr itself: `eprintln!` in a passing test is captured.
            let _ = writeln!(
                std::io::stderr(),
                "\n*** lock-tests: the Valkey tests are SKIPPED ({VALKEY_SERVER_ENV} is unset and \
                 {VALKEY_FETCH_ENV}=no): they pass without having run ***\n"
            );
        });
        return None;
    }
    panic!(
        "no valkey-server for the Valkey tests: run them with scripts/test.sh (which fetches \
         one), or set {VALKEY_SERVER_ENV}=/path/to/valkey-server, or {VALKEY_FETCH_ENV}=no to \
         skip them"
    );
}

/// [`valkey_server`] for a caller that skipped already when there is none.
pub(crate) fn valkey_server_or_panic() -> PathBuf {
    valkey_server().unwrap_or_else(|| panic!("no valkey-server: the caller should have skipped"))
}
