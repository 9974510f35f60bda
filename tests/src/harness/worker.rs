//! Child processes running a binary of this package (`counter_worker`, `redlock_worker`, `holder`),
//! or a script driven line by line on its stdin (the interop tests' foreign lock clients).

// A harness failure should stop the test loudly, with the child's output in the message.
#![allow(clippy::expect_used)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::util::poll_until;

const REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// A child process whose stdout (line by line) and stderr are drained by threads, so a chatty child
/// never blocks on a full pipe. Dropping it kills the child (SIGKILL) and reaps it.
///
/// Integration tests name the binary with `env!("CARGO_BIN_EXE_<name>")`.
#[derive(Debug)]
pub struct Worker {
    name: String,
    child: Child,
    /// Open only for a worker started by [`spawn_driven`](Worker::spawn_driven).
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    stdout: Vec<String>,
    stderr: Option<JoinHandle<String>>,
}

/// What a worker printed, once it exited.
#[derive(Debug)]
pub struct Finished {
    /// The exit status.
    pub status: ExitStatus,
    /// Every stdout line, in order.
    pub stdout: Vec<String>,
    /// All of stderr.
    pub stderr: String,
}

impl Worker {
    /// Starts `binary` with `args`, stdin closed, stdout and stderr captured.
    pub fn spawn<S: AsRef<std::ffi::OsStr>>(binary: &str, args: &[S]) -> Worker {
        Self::spawn_with_env(binary, args, &[])
    }

    /// [`spawn`](Self::spawn) with `env` added to the child's environment.
    pub fn spawn_with_env<S: AsRef<std::ffi::OsStr>>(
        binary: &str,
        args: &[S],
        env: &[(&str, &str)],
    ) -> Worker {
        Self::start(binary, args, env, Stdio::null())
    }

    /// Starts `program` with `args` and stdin open, for [`ask`](Self::ask).
    pub fn spawn_driven<S: AsRef<std::ffi::OsStr>>(program: &str, args: &[S]) -> Worker {
        Self::start(program, args, &[], Stdio::piped())
    }

    fn start<S: AsRef<std::ffi::OsStr>>(
        binary: &str,
        args: &[S],
        env: &[(&str, &str)],
        stdin: Stdio,
    ) -> Worker {
        let name = binary.rsplit('/').next().unwrap_or(binary).to_owned();
        let mut child = Command::new(binary)
            .args(args)
            .envs(env.iter().copied())
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        Worker {
            name,
            stdin: child.stdin.take(),
            child,
            lines,
            stdout: Vec::new(),
            stderr: Some(stderr),
        }
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the child is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The next stdout line; panics (killing the child, with its stderr) if none comes within
    /// `timeout` or stdout closes first.
    pub fn next_line(&mut self, timeout: Duration) -> String {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => {
                self.stdout.push(line.clone());
                line
            }
            Err(why) => {
                let stderr = self.kill_and_collect_stderr();
                panic!(
                    "{} printed no line within {timeout:?} ({why:?})\nstderr: {stderr}",
                    self.name
                );
            }
        }
    }

    /// Writes `command` as one line to the child's stdin, then answers its next stdout line (see
    /// [`next_line`](Self::next_line)). Panics for a worker not started by
    /// [`spawn_driven`](Self::spawn_driven), or whose stdin is closed.
    pub fn ask(&mut self, command: &str, timeout: Duration) -> String {
        let stdin = self
            .stdin
            .as_mut()
            .expect("a worker started by spawn_driven");
        if let Err(e) = writeln!(stdin, "{command}").and_then(|()| stdin.flush()) {
            let stderr = self.kill_and_collect_stderr();
            panic!(
                "{}: cannot send {command:?}: {e}\nstderr: {stderr}",
                self.name
            );
        }
        self.next_line(timeout)
    }

    /// The next stdout line if one comes within `timeout`, else `None` (the child runs on).
    pub fn try_line(&mut self, timeout: Duration) -> Option<String> {
        let line = self.lines.recv_timeout(timeout).ok()?;
        self.stdout.push(line.clone());
        Some(line)
    }

    /// Waits up to `timeout` for the child to exit and returns its output; on timeout the child
    /// is killed and the call panics with its stderr.
    pub fn finish(&mut self, timeout: Duration) -> Finished {
        let status = poll_until(timeout, Duration::from_millis(10), || {
            self.child.try_wait().expect("try_wait on a worker")
        });
        let Some(status) = status else {
            let stderr = self.kill_and_collect_stderr();
            panic!(
                "{} (pid {}) still running after {timeout:?}; killed\nstderr: {stderr}",
                self.name,
                self.pid()
            );
        };
        // The child exited, so stdout reaches its end: the reader thread drops the sender.
        self.stdout.extend(self.lines.iter());
        Finished {
            status,
            stdout: std::mem::take(&mut self.stdout),
            stderr: self.join_stderr(),
        }
    }

    /// SIGKILL and reap (bounded); does nothing if the child already exited.
    pub fn kill(&mut self) {
        if self.is_running() {
            let _ = self.child.kill();
        }
        let reaped = poll_until(REAP_TIMEOUT, Duration::from_millis(2), || {
            self.child.try_wait().map_or(Some(()), |s| s.map(|_| ()))
        });
        if reaped.is_none() {
            eprintln!(
                "lock-tests: {} (pid {}) not reaped within {REAP_TIMEOUT:?}",
                self.name,
                self.pid()
            );
        }
    }

    fn kill_and_collect_stderr(&mut self) -> String {
        self.kill();
        self.join_stderr()
    }

    fn join_stderr(&mut self) -> String {
        self.stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Finished {
    /// Panics with the output unless the child exited with status 0.
    pub fn assert_success(&self, who: &str) -> &Self {
        assert!(
            self.status.success(),
            "{who} exited with {}\nstdout tail: {}\nstderr: {}",
            self.status,
            self.stdout
                .iter()
                .rev()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join(" | "),
            self.stderr
        );
        self
    }
}

/// Waits for every worker, sharing one deadline `timeout` from now.
pub fn finish_all(workers: &mut [Worker], timeout: Duration) -> Vec<Finished> {
    let deadline = Instant::now() + timeout;
    workers
        .iter_mut()
        .map(|w| w.finish(deadline.saturating_duration_since(Instant::now())))
        .collect()
}

impl Worker {
    /// SIGSTOP: the child keeps its sockets and its clocks run on, but none of its threads runs
    /// (a long GC pause, a VM stall). Returns once the kernel reports it stopped (bounded).
    pub fn pause(&self) {
        self.signal_until(nix::sys::signal::Signal::SIGSTOP, true);
    }

    /// SIGCONT: undoes [`pause`](Self::pause). Returns once the child runs again (bounded).
    pub fn resume(&self) {
        self.signal_until(nix::sys::signal::Signal::SIGCONT, false);
    }

    fn signal_until(&self, signal: nix::sys::signal::Signal, stopped: bool) {
        let pid = i32::try_from(self.pid()).expect("pid fits in i32");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
            .unwrap_or_else(|e| panic!("{signal} to {} (pid {pid}): {e}", self.name));
        let stat = format!("/proc/{pid}/stat");
        let seen = poll_until(REAP_TIMEOUT, Duration::from_millis(1), || {
            let text = std::fs::read_to_string(&stat).ok()?;
            // "pid (comm) S ...": the state follows the last ')'.
            let state = text
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            (matches!(state, Some('T' | 't')) == stopped).then_some(())
        });
        assert!(
            seen.is_some(),
            "{} (pid {pid}) not {} {REAP_TIMEOUT:?} after {signal}",
            self.name,
            if stopped { "stopped" } else { "running" }
        );
    }
}
