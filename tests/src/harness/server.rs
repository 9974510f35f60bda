//! `redis-server` child processes on free loopback ports.

// A harness failure should stop the test loudly, with the server log in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

use super::tls::{CA_CERT, SERVER_CERT, SERVER_KEY, TestCa};
use super::util::{free_port, poll_until};

/// Overrides the `redis-server` binary (default: the one on `PATH`).
const BINARY_ENV: &str = "LOCK_TESTS_REDIS_SERVER";

/// The server program [`RedisServer`]s run unless [`ServerOptions::binary`] names another:
/// `LOCK_TESTS_REDIS_SERVER`, else `redis-server` from `PATH`.
pub(crate) fn default_binary() -> std::ffi::OsString {
    std::env::var_os(BINARY_ENV).unwrap_or_else(|| "redis-server".into())
}
const START_ATTEMPTS: usize = 5;
const READY_TIMEOUT: Duration = Duration::from_secs(5);
const READY_POLL: Duration = Duration::from_millis(10);
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);
const REAP_TIMEOUT: Duration = Duration::from_secs(5);
const PORT_FREE_TIMEOUT: Duration = Duration::from_secs(5);
const SIGNAL_TIMEOUT: Duration = Duration::from_secs(2);
const LOG_FILE: &str = "redis.log";
const STDERR_FILE: &str = "stderr.log";
const CONFIG_FILE: &str = "redis.conf";

/// How to start a [`RedisServer`].
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// The server program to run, e.g. a `valkey-server` ([`valkey_server`](crate::valkey_server));
    /// `None`: `LOCK_TESTS_REDIS_SERVER`, else `redis-server` from `PATH`.
    pub binary: Option<PathBuf>,
    /// Password of the `default` user (`requirepass`); [`RedisServer::url`] and
    /// [`RedisServer::admin`] then authenticate with it.
    pub requirepass: Option<String>,
    /// Full ACL lines for the config file, e.g. `user locker on >pw ~lock:* +@all`.
    pub acl_rules: Vec<String>,
    /// `--appendonly yes`: the only way data survives [`RedisServer::restart`].
    pub appendonly: bool,
    /// Appended to the command line, e.g. `["--maxclients", "64"]`.
    pub extra_args: Vec<String>,
    /// Other lines for the config file, e.g. `sentinel monitor ...` (the file stays writable:
    /// Sentinel and Cluster rewrite their own state into it).
    pub config_lines: Vec<String>,
    /// Environment variables added to the process's (kept across [`RedisServer::restart`]), e.g.
    /// `LD_PRELOAD` for libfaketime.
    pub env: Vec<(String, String)>,
    /// Serve TLS only, with this CA's server certificate: the port is the TLS port (`--port 0
    /// --tls-port P`), clients are not asked for a certificate (`extra_args` may say
    /// `--tls-auth-clients yes`), and the server's own links to other servers (replication,
    /// cluster bus, a sentinel's) use TLS too. [`RedisServer::url`] is then `rediss://`, and
    /// the harness's own connections trust the CA and present its client certificate.
    pub tls: Option<TestCa>,
}

/// One `redis-server` process bound to 127.0.0.1 with its own temporary directory (config, log, data).
///
/// Dropping it kills the process (even while frozen), reaps it and removes the directory.
#[derive(Debug)]
pub struct RedisServer {
    opts: ServerOptions,
    dir: TempDir,
    port: u16,
    pid: u32,
    child: Option<Child>,
    frozen: AtomicBool,
}

impl RedisServer {
    /// Starts a server with [`ServerOptions::default`].
    pub fn start() -> RedisServer {
        Self::start_with(ServerOptions::default())
    }

    /// Starts a server on a free port and returns once it answers `PING` (bounded; panics with the log).
    pub fn start_with(opts: ServerOptions) -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("lock-tests-redis-")
            .tempdir()
            .expect("create a temporary directory for redis-server");
        write_config(dir.path(), &opts);
        let mut failures = String::new();
        for _ in 0..START_ATTEMPTS {
            // The port may be taken between `free_port` and redis binding it; then try another one.
            let port = free_port();
            match spawn_ready(dir.path(), &opts, port) {
                Ok(child) => {
                    return RedisServer {
                        pid: child.id(),
                        child: Some(child),
                        opts,
                        dir,
                        port,
                        frozen: AtomicBool::new(false),
                    };
                }
                Err(why) => {
                    let _ = writeln!(failures, "--- port {port}: {why}");
                }
            }
        }
        panic!("redis-server did not start in {START_ATTEMPTS} attempts:\n{failures}");
    }

    /// The port the server listens on (stable across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/`, or `redis://:PASS@127.0.0.1:PORT/` with `requirepass`
    /// (`rediss://` with [`tls`](ServerOptions::tls)).
    pub fn url(&self) -> String {
        url(&self.opts, self.port)
    }

    /// `redis://USER:PASS@127.0.0.1:PORT/` for an ACL user (`rediss://` with TLS).
    pub fn url_as(&self, user: &str, pass: &str) -> String {
        format!(
            "{}://{}:{}@127.0.0.1:{}/",
            scheme(&self.opts),
            encode(user),
            encode(pass),
            self.port
        )
    }

    /// A client for [`url`](Self::url) that trusts the server's test CA, if it has one.
    pub fn client(&self) -> redis::Client {
        client(&self.opts, self.port)
            .unwrap_or_else(|e| panic!("a client for the server on port {}: {e}", self.port))
    }

    /// A sync connection as the `default` user (with `requirepass` if set), 2 s connect/read/write
    /// timeouts. Panics with the log tail if the server does not accept it.
    pub fn admin(&self) -> redis::Connection {
        let result = client(&self.opts, self.port).and_then(|client| {
            let con = client.get_connection_with_timeout(ADMIN_TIMEOUT)?;
            con.set_read_timeout(Some(ADMIN_TIMEOUT))?;
            con.set_write_timeout(Some(ADMIN_TIMEOUT))?;
            Ok(con)
        });
        result.unwrap_or_else(|e| {
            panic!(
                "admin connection to redis-server on port {} failed: {e}\n{}",
                self.port,
                self.log_tail(20)
            )
        })
    }

    /// The ids of the clients connected (`CLIENT LIST`), but the one asking; ids grow with each
    /// connection.
    pub fn client_ids(&self) -> Vec<u64> {
        self.clients().into_iter().map(|(id, _)| id).collect()
    }

    /// The clients connected (`CLIENT LIST`), but the one asking: each one's id and the last
    /// command it ran (`cmd=`, lowercase, e.g. `evalsha`).
    pub fn clients(&self) -> Vec<(u64, String)> {
        let mut admin = self.admin();
        let mut asked = || -> redis::RedisResult<(u64, String)> {
            let me = redis::cmd("CLIENT").arg("ID").query(&mut admin)?;
            let list = redis::cmd("CLIENT").arg("LIST").query(&mut admin)?;
            Ok((me, list))
        };
        let (me, list) =
            asked().unwrap_or_else(|e| panic!("CLIENT LIST on port {} failed: {e}", self.port));
        list.lines()
            .filter_map(|line| {
                let field = |name: &str| {
                    line.split(' ')
                        .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                };
                Some((field("id")?.parse().ok()?, field("cmd")?.to_owned()))
            })
            .filter(|(id, _)| *id != me)
            .collect()
    }

    /// The port a client connected from (`addr=` in `CLIENT LIST`), by its id.
    pub fn client_port(&self, id: u64) -> Option<u16> {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .arg("ID")
            .arg(id)
            .query(&mut self.admin())
            .unwrap_or_else(|e| panic!("CLIENT LIST on port {} failed: {e}", self.port));
        list.split(' ')
            .find_map(|f| f.strip_prefix("addr="))?
            .rsplit_once(':')?
            .1
            .parse()
            .ok()
    }

    /// How many bytes the server has not read yet from the client connected from `peer_port`
    /// (the receive queue of its socket, as `/proc/net/tcp` says): asked of the kernel, so it
    /// answers while the server is frozen. 0 when there is no such connection.
    pub fn unread_from(&self, peer_port: u16) -> u64 {
        let table = fs::read_to_string("/proc/net/tcp").unwrap();
        table
            .lines()
            .skip(1)
            .find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let port = |addr: &str| u16::from_str_radix(addr.rsplit_once(':')?.1, 16).ok();
                let here = port(fields.get(1)?)?;
                let there = port(fields.get(2)?)?;
                (here == self.port && there == peer_port)
                    .then(|| u64::from_str_radix(fields.get(4)?.rsplit_once(':')?.1, 16).ok())
                    .flatten()
            })
            .unwrap_or(0)
    }

    /// `KEYS pattern` as admin, sorted.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut self.admin())
            .unwrap_or_else(|e| panic!("KEYS {pattern} on port {} failed: {e}", self.port));
        keys.sort();
        keys
    }

    /// How many members the sorted set `key` holds (`ZCARD`: no script, no `GET`), e.g. a fair
    /// lock's line.
    pub fn zcard(&self, key: &str) -> u64 {
        redis::cmd("ZCARD")
            .arg(key)
            .query(&mut self.admin())
            .unwrap_or_else(|e| panic!("ZCARD {key} on port {} failed: {e}", self.port))
    }

    /// How many times `command` (lowercase, e.g. `evalsha`) ran since start, from `INFO commandstats`.
    pub fn command_calls(&self, command: &str) -> u64 {
        self.command_stat(command, "calls")
    }

    /// How many subscriptions listen for the releases of the lock whose release channel is
    /// `channel`: to `channel` itself (`PUBSUB NUMSUB`), and to the own channels of its queued
    /// waiters, `channel{<digest>}` (`PUBSUB CHANNELS`).
    pub fn subscribers(&self, channel: &str) -> i64 {
        self.listeners("", channel)
    }

    /// [`subscribers`](Self::subscribers) in sharded pub/sub (a cluster node).
    pub fn shard_subscribers(&self, channel: &str) -> i64 {
        self.listeners("SHARD", channel)
    }

    /// [`subscribers`](Self::subscribers) over plain (`kind` "") or sharded ("SHARD") pub/sub.
    fn listeners(&self, kind: &str, channel: &str) -> i64 {
        let mut admin = self.admin();
        let own: Vec<String> = redis::cmd("PUBSUB")
            .arg(format!("{kind}CHANNELS"))
            .arg(format!("{}{{*}}", glob_escape(channel)))
            .query(&mut admin)
            .unwrap_or_else(|e| panic!("PUBSUB {kind}CHANNELS on port {}: {e}", self.port));
        let subs: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg(format!("{kind}NUMSUB"))
            .arg(channel)
            .arg(&own)
            .query(&mut admin)
            .unwrap_or_else(|e| panic!("PUBSUB {kind}NUMSUB on port {}: {e}", self.port));
        subs.iter().map(|(_, n)| *n).sum()
    }

    /// Kills the process (SIGKILL, so nothing is saved) and reaps it. Does nothing if already stopped.
    pub fn stop(&mut self) {
        if !self.kill_and_reap() {
            panic!(
                "redis-server (pid {}) on port {} was not reaped within {REAP_TIMEOUT:?}",
                self.pid, self.port
            );
        }
    }

    /// Stops the server if running, then starts it again on the same port with the same options.
    ///
    /// The dataset is empty afterwards unless `appendonly` is on (then the AOF is replayed).
    /// Returns once the server answers `PING`; panics with the log if it does not within the bound.
    pub fn restart(&mut self) {
        self.stop();
        if !self.opts.appendonly {
            let _ = fs::remove_file(self.dir.path().join("dump.rdb"));
            let _ = fs::remove_dir_all(self.dir.path().join("appendonlydir"));
        }
        let mut failures = String::new();
        for _ in 0..START_ATTEMPTS {
            if !wait_port_free(self.port) {
                let _ = writeln!(
                    failures,
                    "--- port still in use after {PORT_FREE_TIMEOUT:?}"
                );
                continue;
            }
            match spawn_ready(self.dir.path(), &self.opts, self.port) {
                Ok(child) => {
                    self.pid = child.id();
                    self.child = Some(child);
                    return;
                }
                Err(why) => {
                    let _ = writeln!(failures, "--- {why}");
                }
            }
        }
        panic!(
            "redis-server did not restart on port {} in {START_ATTEMPTS} attempts:\n{failures}",
            self.port
        );
    }

    /// SIGSTOP: the process keeps its sockets but answers nothing (a long GC pause or a hung host).
    /// Returns once the kernel reports the process as stopped.
    pub fn freeze(&self) {
        self.signal(Signal::SIGSTOP);
        self.frozen.store(true, Ordering::SeqCst);
        if !wait_stopped_state(self.pid, true) {
            panic!(
                "redis-server (pid {}) not stopped {SIGNAL_TIMEOUT:?} after SIGSTOP",
                self.pid
            );
        }
    }

    /// SIGCONT: undoes [`freeze`](Self::freeze). Returns once the process is running again.
    pub fn thaw(&self) {
        self.signal(Signal::SIGCONT);
        self.frozen.store(false, Ordering::SeqCst);
        if !wait_stopped_state(self.pid, false) {
            panic!(
                "redis-server (pid {}) still stopped {SIGNAL_TIMEOUT:?} after SIGCONT",
                self.pid
            );
        }
    }

    /// The server's own temporary directory (config, log, data).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Whether the process is running (not stopped by [`stop`](Self::stop)).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// One counter of `command` in `INFO commandstats` (`calls`, `rejected_calls`, ...); 0 when
    /// the command never came.
    pub fn command_stat(&self, command: &str, stat: &str) -> u64 {
        self.stats().command(command, stat)
    }

    /// How many replies were the error `code` (e.g. `NOSCRIPT`) since start, from
    /// `INFO errorstats`; 0 when there was none.
    pub fn error_count(&self, code: &str) -> u64 {
        self.stats().errors(code)
    }

    /// `INFO commandstats errorstats` in one reply: counters that are compared with each other
    /// are read at one moment.
    pub fn stats(&self) -> Stats {
        let info = redis::cmd("INFO")
            .arg("commandstats")
            .arg("errorstats")
            .query(&mut self.admin())
            .unwrap_or_else(|e| panic!("INFO on port {} failed: {e}", self.port));
        Stats { info }
    }

    /// `INFO <section>` as admin.
    pub fn info(&self, section: &str) -> String {
        redis::cmd("INFO")
            .arg(section)
            .query(&mut self.admin())
            .unwrap_or_else(|e| panic!("INFO {section} on port {} failed: {e}", self.port))
    }

    /// Pid of the current process (of the last one, once stopped).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The last `lines` lines of the server log (and of its stderr, if any), for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let mut out = format!("--- redis-server log (port {}) ---\n", self.port);
        out.push_str(&tail(
            &read_lossy(&self.dir.path().join(LOG_FILE), 0),
            lines,
        ));
        let stderr = read_lossy(&self.dir.path().join(STDERR_FILE), 0);
        if !stderr.trim().is_empty() {
            out.push_str("\n--- stderr ---\n");
            out.push_str(&tail(&stderr, lines));
        }
        out
    }

    fn signal(&self, signal: Signal) {
        assert!(
            self.child.is_some(),
            "{signal} to redis-server on port {}: it is not running",
            self.port
        );
        kill(pid_of(self.pid), signal)
            .unwrap_or_else(|e| panic!("{signal} to redis-server (pid {}): {e}", self.pid));
    }

    /// SIGKILL + bounded reap; `false` if the process could not be reaped in time.
    fn kill_and_reap(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        // SIGKILL also ends a stopped process; no SIGCONT needed.
        let _ = child.kill();
        self.frozen.store(false, Ordering::SeqCst);
        poll_until(REAP_TIMEOUT, Duration::from_millis(2), || {
            child
                .try_wait()
                .map_or(Some(()), |status| status.map(|_| ()))
        })
        .is_some()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.frozen.load(Ordering::SeqCst) && self.child.is_some() {
            let _ = kill(pid_of(self.pid), Signal::SIGCONT);
        }
        if !self.kill_and_reap() {
            eprintln!(
                "lock-tests: redis-server (pid {}) was not reaped within {REAP_TIMEOUT:?}",
                self.pid
            );
        }
    }
}

/// N independent masters (not a Redis Cluster: no replication, no slots), e.g. for Redlock.
#[derive(Debug)]
pub struct RedisMasters {
    /// The servers, each on its own port.
    pub nodes: Vec<RedisServer>,
}

impl RedisMasters {
    /// Starts `n` servers with default options.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, &ServerOptions::default())
    }

    /// Starts `n` servers with the same options (in parallel).
    pub fn start_with(n: usize, opts: &ServerOptions) -> Self {
        let nodes = thread::scope(|scope| {
            let handles: Vec<_> = (0..n)
                .map(|_| scope.spawn(|| RedisServer::start_with(opts.clone())))
                .collect();
            handles
                .into_iter()
                .map(|handle| {
                    handle
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        RedisMasters { nodes }
    }

    /// [`RedisServer::url`] of every node, in node order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

fn write_config(dir: &Path, opts: &ServerOptions) {
    let mut config = String::from("# generated by lock-tests\n");
    if let Some(pass) = &opts.requirepass {
        let quoted = pass.replace('\\', "\\\\").replace('"', "\\\"");
        let _ = writeln!(config, "requirepass \"{quoted}\"");
    }
    for line in opts.acl_rules.iter().chain(&opts.config_lines) {
        let _ = writeln!(config, "{line}");
    }
    fs::write(dir.join(CONFIG_FILE), config).expect("write redis.conf");
}

/// Spawns redis-server on `port` and waits until it answers. `Err` (with the log) if it exited early,
/// so the caller may retry; panics if it is still running but not ready after the bound.
fn spawn_ready(dir: &Path, opts: &ServerOptions, port: u16) -> Result<Child, String> {
    let log = dir.join(LOG_FILE);
    let log_offset = fs::metadata(&log).map_or(0, |m| m.len());
    let stderr = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(STDERR_FILE))
        .expect("open redis-server stderr file");
    let binary = opts
        .binary
        .as_ref()
        .map_or_else(default_binary, |path| path.clone().into_os_string());
    let port_args: Vec<std::ffi::OsString> = match &opts.tls {
        None => vec!["--port".into(), port.to_string().into()],
        Some(ca) => [
            [
                "--port".into(),
                "0".into(),
                "--tls-port".into(),
                port.to_string().into(),
            ],
            [
                "--tls-cert-file".into(),
                ca.file(SERVER_CERT).into(),
                "--tls-key-file".into(),
                ca.file(SERVER_KEY).into(),
            ],
            [
                "--tls-ca-cert-file".into(),
                ca.file(CA_CERT).into(),
                "--tls-auth-clients".into(),
                "no".into(),
            ],
            [
                "--tls-replication".into(),
                "yes".into(),
                "--tls-cluster".into(),
                "yes".into(),
            ],
        ]
        .concat(),
    };
    let mut child = Command::new(&binary)
        .arg(dir.join(CONFIG_FILE))
        .args(port_args)
        .args(["--bind", "127.0.0.1", "--save", ""])
        .args(["--appendonly", if opts.appendonly { "yes" } else { "no" }])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&log)
        .args(["--daemonize", "no", "--protected-mode", "no"])
        .args(&opts.extra_args)
        .envs(opts.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {binary:?} (is it installed?): {e}"));
    let client = client(opts, port).unwrap_or_else(|e| panic!("a client for port {port}: {e}"));
    let pid = child.id();
    let outcome = poll_until(READY_TIMEOUT, READY_POLL, || {
        match child.try_wait() {
            Ok(Some(status)) => return Some(Err(status.to_string())),
            Ok(None) => {}
            Err(e) => return Some(Err(format!("waiting for redis-server failed: {e}"))),
        }
        ready(&client, pid).then_some(Ok(()))
    });
    match outcome {
        Some(Ok(())) => Ok(child),
        Some(Err(status)) => Err(format!(
            "redis-server exited early ({status})\n{}{}",
            tail(&read_lossy(&log, log_offset), 20),
            tail(&read_lossy(&dir.join(STDERR_FILE), 0), 20),
        )),
        None => {
            let _ = child.kill();
            let _ = poll_until(REAP_TIMEOUT, Duration::from_millis(2), || {
                child.try_wait().ok().flatten()
            });
            panic!(
                "redis-server on port {port} not ready within {READY_TIMEOUT:?}\n{}",
                tail(&read_lossy(&log, log_offset), 30)
            );
        }
    }
}

/// `PING` answered (so not loading) by *our* process, not by another test's server that won the port.
fn ready(client: &redis::Client, pid: u32) -> bool {
    let probe = || -> redis::RedisResult<String> {
        let mut con = client.get_connection_with_timeout(PROBE_TIMEOUT)?;
        con.set_read_timeout(Some(PROBE_TIMEOUT))?;
        con.set_write_timeout(Some(PROBE_TIMEOUT))?;
        let (_pong, info): (String, String) = redis::pipe()
            .cmd("PING")
            .cmd("INFO")
            .arg("server")
            .query(&mut con)?;
        Ok(info)
    };
    probe().is_ok_and(|info| {
        info.lines()
            .any(|line| line.trim() == format!("process_id:{pid}"))
    })
}

fn wait_port_free(port: u16) -> bool {
    poll_until(PORT_FREE_TIMEOUT, READY_POLL, || {
        TcpListener::bind((Ipv4Addr::LOCALHOST, port))
            .ok()
            .map(drop)
    })
    .is_some()
}

/// Waits until `/proc/PID/stat` shows the process as stopped (or not). `true` without `/proc`.
fn wait_stopped_state(pid: u32, stopped: bool) -> bool {
    let stat = PathBuf::from(format!("/proc/{pid}/stat"));
    poll_until(SIGNAL_TIMEOUT, Duration::from_millis(1), || {
        let Ok(text) = fs::read_to_string(&stat) else {
            return Some(());
        };
        // "pid (comm) S ...": the state follows the last ')'.
        let state = text
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        let is_stopped = matches!(state, Some('T' | 't'));
        (is_stopped == stopped).then_some(())
    })
    .is_some()
}

fn pid_of(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).expect("pid fits in i32"))
}

fn read_lossy(path: &Path, offset: u64) -> String {
    let mut bytes = Vec::new();
    if let Ok(mut file) = File::open(path)
        && file.seek(SeekFrom::Start(offset)).is_ok()
    {
        let _ = file.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    let mut out = all[all.len().saturating_sub(lines)..].join("\n");
    out.push('\n');
    out
}

fn scheme(opts: &ServerOptions) -> &'static str {
    if opts.tls.is_some() {
        "rediss"
    } else {
        "redis"
    }
}

/// The `default` user's URL of a server started with `opts` on `port`.
fn url(opts: &ServerOptions, port: u16) -> String {
    let scheme = scheme(opts);
    match &opts.requirepass {
        Some(pass) => format!("{scheme}://:{}@127.0.0.1:{port}/", encode(pass)),
        None => format!("{scheme}://127.0.0.1:{port}/"),
    }
}

/// A client for [`url`], trusting the test CA of a TLS server and presenting its client
/// certificate.
fn client(opts: &ServerOptions, port: u16) -> redis::RedisResult<redis::Client> {
    let url = url(opts, port);
    match &opts.tls {
        Some(ca) => redis::Client::build_with_tls(url, ca.certificates()),
        None => redis::Client::open(url),
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters, for URL userinfo.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `text` as a glob pattern of itself (Redis's `KEYS`, `PUBSUB CHANNELS`).
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The command and error counters of one server at one moment (see [`RedisServer::stats`]).
#[derive(Debug)]
pub struct Stats {
    info: String,
}

impl Stats {
    /// One counter of `command` (lowercase, e.g. `evalsha`): `calls`, `failed_calls`, ...; 0
    /// when the command never came.
    pub fn command(&self, command: &str, stat: &str) -> u64 {
        let prefix = format!("cmdstat_{command}:");
        self.info
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .and_then(|fields| {
                fields
                    .split(',')
                    .find_map(|field| field.strip_prefix(stat)?.strip_prefix('='))
            })
            .map_or(0, |n| self.number(n, &prefix))
    }

    /// The `calls` of every command that came, by name (lowercase; a subcommand as
    /// `config|set`): the commands a script ran are counted too.
    pub fn calls(&self) -> std::collections::BTreeMap<String, u64> {
        self.info
            .lines()
            .filter_map(|line| line.strip_prefix("cmdstat_"))
            .filter_map(|line| {
                let (command, _) = line.split_once(':')?;
                Some((command.to_owned(), self.command(command, "calls")))
            })
            .collect()
    }

    /// What ran between `earlier` and this reading: each command's calls, without those that did
    /// not come in between, nor the readings' own `INFO`.
    pub fn since(&self, earlier: &Stats) -> std::collections::BTreeMap<String, u64> {
        let before = earlier.calls();
        self.calls()
            .into_iter()
            .map(|(command, n)| {
                let was = before.get(&command).copied().unwrap_or(0);
                (command, n - was)
            })
            .filter(|(command, n)| *n > 0 && command != "info")
            .collect()
    }

    /// How many replies were the error `code` (e.g. `NOSCRIPT`); 0 when there was none.
    pub fn errors(&self, code: &str) -> u64 {
        let prefix = format!("errorstat_{code}:count=");
        self.info
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .map_or(0, |n| self.number(n, &prefix))
    }

    fn number(&self, n: &str, what: &str) -> u64 {
        n.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{what} in {:?}: {e}", self.info))
    }
}
