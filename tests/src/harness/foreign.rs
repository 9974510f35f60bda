//! Lock clients of other languages for the interop tests: redis-py's `Lock` and node-redlock, run
//! by the scripts under `tests/interop/` as [`Worker`]s driven line by line, with the venv and the
//! `node_modules` that `scripts/test.sh` installs under `<target>/interop/`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

use super::worker::Worker;

/// `no`: `scripts/test.sh` installs nothing for the interop tests, and they are skipped.
const INTEROP_ENV: &str = "LOCK_TESTS_INTEROP";

/// How long a script may take to start and connect (an interpreter's start on a loaded machine).
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Which foreign client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Foreign {
    /// redis-py's `redis.lock.Lock` (`tests/interop/lock.py`), on one node.
    RedisPy,
    /// node-redlock over `ioredis` clients (`tests/interop/lock.mjs`), on one node or several.
    NodeRedlock,
}

/// Where the foreign clients are installed: `<target>/interop/`, as `scripts/test.sh` puts them
/// (the target folder is `CARGO_TARGET_DIR`, or the workspace's `target/`).
#[derive(Debug, Clone)]
pub struct Interop {
    dir: PathBuf,
}

impl Interop {
    /// The installed clients, or `None` (the caller skips its test) when `LOCK_TESTS_INTEROP` is
    /// `no`; this is then said once per test binary on stderr, past the test harness's capture.
    /// Panics when they are not installed: the interop tests must not pass for having run nothing.
    pub fn find() -> Option<Interop> {
        if std::env::var_os(INTEROP_ENV).is_some_and(|v| v == "no") {
            static SAID: Once = Once::new();
            SAID.call_once(|| {
                // Written to the process's stderr itself: `eprintln!` in a passing test is captured.
                let _ = writeln!(
                    std::io::stderr(),
                    "\n*** lock-tests: the interop tests are SKIPPED ({INTEROP_ENV}=no): they pass \
                     without having run ***\n"
                );
            });
            return None;
        }
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .filter(|d| !d.is_empty())
            .map_or_else(
                || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
                PathBuf::from,
            );
        let interop = Interop {
            dir: target.join("interop"),
        };
        let needed = [
            interop.python(),
            interop.node_modules().join("redlock/package.json"),
        ];
        let node = std::process::Command::new("node")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if let Some(missing) = needed.iter().find(|p| !p.exists()) {
            panic!(
                "{} is missing: the interop tests need redis-py and node-redlock installed by \
                 scripts/test.sh (run it once), or {INTEROP_ENV}=no to skip them",
                missing.display()
            );
        }
        assert!(
            node,
            "no `node` on PATH: the interop tests need Node.js (scripts/test.sh installs it), or \
             {INTEROP_ENV}=no to skip them"
        );
        Some(interop)
    }

    /// Starts `client` on `key` (the full Redis key) over the nodes at `ports` (redis-py: one)
    /// with a lock ttl of `ttl`, and waits until it says it is ready.
    pub fn start(&self, client: Foreign, ports: &[u16], key: &str, ttl: Duration) -> Worker {
        let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("interop");
        let mut args: Vec<String> = Vec::new();
        let program = match client {
            Foreign::RedisPy => {
                assert_eq!(ports.len(), 1, "redis-py's Lock is on one node");
                args.push(scripts.join("lock.py").display().to_string());
                self.python().display().to_string()
            }
            Foreign::NodeRedlock => {
                args.push(scripts.join("lock.mjs").display().to_string());
                args.push("--node-modules".to_owned());
                args.push(self.node_modules().display().to_string());
                "node".to_owned()
            }
        };
        for port in ports {
            args.extend(["--port".to_owned(), port.to_string()]);
        }
        args.extend(["--key".to_owned(), key.to_owned()]);
        args.extend(["--ttl-ms".to_owned(), ttl.as_millis().to_string()]);
        let mut worker = Worker::spawn_driven(&program, &args);
        let ready = worker.next_line(START_TIMEOUT);
        assert_eq!(ready, "ready", "{client:?} did not start");
        worker
    }

    fn python(&self) -> PathBuf {
        self.dir.join("venv/bin/python")
    }

    fn node_modules(&self) -> PathBuf {
        self.dir.join("node/node_modules")
    }
}
