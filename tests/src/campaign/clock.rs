//! Server clock steps with libfaketime: a [`FakeClock`] is one server's offset file, read by
//! libfaketime on every clock read of a `redis-server` started with [`FakeClock::env`], so the
//! nemesis can move that server's wall clock while it runs. The monotonic clock is left alone
//! (`FAKETIME_DONT_FAKE_MONOTONIC`): Redis 7 times its event loop and cron by it, and expires keys
//! by the wall clock (`TIME`, `PX` deadlines), which is the fault.
//!
//! Debian's `redis-server` is linked with jemalloc, which hangs under libfaketime alone
//! (libfaketime issue #130): jemalloc's initialisation reads the clock and initialises a
//! condition variable, libfaketime intercepts both and looks its own symbols up with `dlsym`,
//! which allocates while jemalloc holds its init lock. A small library preloaded before
//! libfaketime ([`SHIM`], compiled once per test process with `cc`) answers those two calls
//! itself until jemalloc is up, then forwards them.

// A harness failure should stop the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tempfile::TempDir;

/// Overrides the libfaketime library (default: Debian's multi-threaded one).
const LIBFAKETIME_ENV: &str = "LOCK_TESTS_LIBFAKETIME";
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
const OFFSET_FILE: &str = "faketime-offset";

/// The C source of the library preloaded before libfaketime (see the module docs).
const SHIM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int (*next_clock_gettime)(clockid_t, struct timespec *);
static int (*next_cond_init)(pthread_cond_t *, const pthread_condattr_t *);
static volatile int ready;

int clock_gettime(clockid_t clock, struct timespec *ts) {
  if (!ready) return (int)syscall(SYS_clock_gettime, clock, ts);
  return next_clock_gettime(clock, ts);
}

int pthread_cond_init(pthread_cond_t *cond, const pthread_condattr_t *attr) {
  if (!ready && attr == NULL) {
    memset(cond, 0, sizeof *cond);
    return 0;
  }
  return next_cond_init(cond, attr);
}

__attribute__((constructor)) static void init(void) {
  free(malloc(1));
  next_clock_gettime =
      (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
  next_cond_init = (int (*)(pthread_cond_t *, const pthread_condattr_t *))dlvsym(
      RTLD_NEXT, "pthread_cond_init", "GLIBC_2.3.2");
  if (next_clock_gettime && next_cond_init) ready = 1;
}
"#;

/// `LD_PRELOAD` for a server under libfaketime: the shim, then libfaketime. Compiled once per
/// process; panics when libfaketime or `cc` is missing (`scripts/test.sh` installs faketime).
fn preload() -> &'static str {
    static PRELOAD: OnceLock<(TempDir, String)> = OnceLock::new();
    &PRELOAD
        .get_or_init(|| {
            let libfaketime = std::env::var(LIBFAKETIME_ENV).unwrap_or_else(|_| LIBFAKETIME.into());
            assert!(
                Path::new(&libfaketime).exists(),
                "{libfaketime} not found: install libfaketime (Debian package faketime, as \
                 scripts/test.sh does) or set {LIBFAKETIME_ENV}"
            );
            let dir = tempfile::Builder::new()
                .prefix("lock-tests-faketime-")
                .tempdir()
                .expect("create a temporary directory for the libfaketime shim");
            let source = dir.path().join("shim.c");
            let shim = dir.path().join("shim.so");
            fs::write(&source, SHIM).expect("write the libfaketime shim");
            let out = Command::new("cc")
                .args(["-shared", "-fPIC", "-O2", "-o"])
                .arg(&shim)
                .arg(&source)
                .arg("-ldl")
                .output()
                .expect("run cc to build the libfaketime shim");
            assert!(
                out.status.success(),
                "cc failed on the libfaketime shim: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let preload = format!("{}:{libfaketime}", shim.display());
            (dir, preload)
        })
        .1
}

/// One server's fake clock: an offset file read by libfaketime at every clock read.
#[derive(Debug)]
pub struct FakeClock {
    dir: TempDir,
}

impl FakeClock {
    /// A clock at offset 0.
    pub fn new() -> FakeClock {
        let dir = tempfile::Builder::new()
            .prefix("lock-tests-clock-")
            .tempdir()
            .expect("create a temporary directory for a fake clock");
        let clock = FakeClock { dir };
        clock.set(0);
        clock
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join(OFFSET_FILE)
    }

    /// The environment of a process under this clock (for `ServerOptions::env`).
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("LD_PRELOAD", preload().to_owned()),
            ("FAKETIME_TIMESTAMP_FILE", self.file().display().to_string()),
            ("FAKETIME_NO_CACHE", "1".to_owned()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v))
        .into()
    }

    /// Moves the clock to `offset_ms` from the real one (written aside, then renamed in, so a
    /// clock read never sees half a file).
    pub fn set(&self, offset_ms: i64) {
        let sign = if offset_ms < 0 { '-' } else { '+' };
        let ms = offset_ms.unsigned_abs();
        let text = format!("{sign}{}.{:03}\n", ms / 1000, ms % 1000);
        let aside = self.dir.path().join("offset.new");
        fs::write(&aside, text).expect("write a fake clock offset");
        fs::rename(&aside, self.file()).expect("move a fake clock offset in place");
    }
}

impl Default for FakeClock {
    fn default() -> FakeClock {
        FakeClock::new()
    }
}

/// The wall clock in ms since the epoch.
pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// How far the clock of the server at `con` is from the real one, by its `TIME` reply (`None`
/// when it does not answer).
pub fn server_offset(con: &mut redis::Connection) -> Option<i64> {
    let before = wall_ms();
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con).ok()?;
    let after = wall_ms();
    Some(secs * 1000 + micros / 1000 - (before + after) / 2)
}

/// How far off a server's `TIME` may be from the offset it was given (a loaded machine).
pub const TOLERANCE: Duration = Duration::from_millis(250);
