//! `etcd` member processes on free loopback ports (feature `etcd`): one member, or a cluster of
//! three started together with `--initial-cluster`.
//!
//! Members run with a 50ms heartbeat and a 500ms election timeout, so a new leader is elected
//! within about a second and the shortest lease etcd grants is 1s. Every member has a data
//! directory in one temporary directory. Dropping the cluster kills its members (even while
//! frozen) and removes the directory; a cluster kept in a `static` (see [`EtcdCluster::shared`])
//! is never dropped, so each member is also watched by a `sh` loop that kills it, and removes
//! the directory, once the test process is gone.
//!
//! The harness reads the cluster through etcd's JSON gateway (`/v3/kv/range`,
//! `/v3/maintenance/status`) and `/health` and `/metrics` over plain HTTP/1.0 on 127.0.0.1: no
//! client library on the harness side.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fmt::Write as _;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

use super::proxy::FaultProxy;
use super::store::LockStore;
use super::tls::{SERVER_CERT, SERVER_KEY, TestCa};
use super::util::free_ports;

/// Overrides the `etcd` binary (default: the one on `PATH`).
pub const ETCD_BINARY_ENV: &str = "LOCK_TESTS_ETCD";

/// The members' raft election timeout. A follower that hears no heartbeat starts an election
/// after a random time between one and two of these, so a cluster whose leader died has a new
/// one about twice this after the death, plus a vote.
pub const ETCD_ELECTION_TIMEOUT: Duration = Duration::from_millis(500);

/// The members' raft heartbeat interval.
const HEARTBEAT: Duration = Duration::from_millis(50);

const READY_TIMEOUT: Duration = Duration::from_secs(20);
const START_ATTEMPTS: usize = 3;
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);

/// One member: its ports, its process (None while killed).
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    /// With TLS: the `https://` client port the lock clients use (`client_port` stays plain
    /// HTTP, for the harness's own reads).
    tls_port: Option<u16>,
    peer_port: u16,
    child: Option<Child>,
    watchdog: Option<Child>,
}

/// An etcd cluster of one or three members on 127.0.0.1.
#[derive(Debug)]
pub struct EtcdCluster {
    dir: TempDir,
    members: Vec<Member>,
    token: String,
    tls: Option<TestCa>,
}

impl EtcdCluster {
    /// Starts `n` members and returns once every one reports itself healthy (it has a leader);
    /// bounded, panics with the members' log tails.
    pub fn start(n: usize) -> EtcdCluster {
        Self::start_with(n, None)
    }

    /// [`start`](Self::start), each member also serving clients over TLS with `ca`'s server
    /// certificate on a port of its own: [`endpoints`](Self::endpoints) are then those
    /// `https://` ones (the plain client port stays, on loopback, for the harness's reads).
    pub fn start_tls(n: usize, ca: &TestCa) -> EtcdCluster {
        Self::start_with(n, Some(ca.clone()))
    }

    fn start_with(n: usize, tls: Option<TestCa>) -> EtcdCluster {
        let mut failures = String::new();
        for attempt in 0..START_ATTEMPTS {
            let dir = tempfile::Builder::new()
                .prefix("lock-tests-etcd-")
                .tempdir()
                .expect("create a temporary directory for etcd");
            // Every port of the cluster distinct (see `free_ports`).
            let mut ports = free_ports(3 * n).into_iter();
            let mut port = || ports.next().expect("three ports per member");
            let members = (0..n)
                .map(|i| Member {
                    name: format!("m{i}"),
                    client_port: port(),
                    tls_port: tls.as_ref().map(|_| port()),
                    peer_port: port(),
                    child: None,
                    watchdog: None,
                })
                .collect();
            let mut cluster = EtcdCluster {
                dir,
                members,
                token: format!("lock-tests-{}-{attempt}", std::process::id()),
                tls: tls.clone(),
            };
            for i in 0..n {
                cluster.spawn(i);
            }
            match cluster.wait_healthy((0..n).collect(), READY_TIMEOUT) {
                Ok(()) => return cluster,
                Err(why) => {
                    let _ = writeln!(failures, "--- attempt {attempt}: {why}");
                }
            }
        }
        panic!("etcd did not start in {START_ATTEMPTS} attempts:\n{failures}");
    }

    /// A cluster of `n` (1 or 3) members shared by every test of this test binary: tests use
    /// distinct keys, and never stop its members (start their own cluster for that).
    pub fn shared(n: usize) -> &'static EtcdCluster {
        static ONE: OnceLock<EtcdCluster> = OnceLock::new();
        static THREE: OnceLock<EtcdCluster> = OnceLock::new();
        match n {
            1 => ONE.get_or_init(|| EtcdCluster::start(1)),
            3 => THREE.get_or_init(|| EtcdCluster::start(3)),
            _ => panic!("shared etcd clusters have 1 or 3 members, not {n}"),
        }
    }

    /// One member over TLS with [`TestCa::shared`], shared like [`shared`](Self::shared).
    pub fn shared_tls() -> &'static EtcdCluster {
        static ONE: OnceLock<EtcdCluster> = OnceLock::new();
        ONE.get_or_init(|| EtcdCluster::start_tls(1, TestCa::shared()))
    }

    fn member_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(&self.members[i].name)
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[i].name))
    }

    /// Starts member `i` (again, on the same ports and data).
    fn spawn(&mut self, i: usize) {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let member = &self.members[i];
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let (listen, advertise, tls) = match (&self.tls, member.tls_port) {
            (Some(ca), Some(port)) => {
                let https = format!("https://127.0.0.1:{port}");
                let files = vec![
                    "--cert-file".into(),
                    ca.file(SERVER_CERT).into_os_string(),
                    "--key-file".into(),
                    ca.file(SERVER_KEY).into_os_string(),
                ];
                (format!("{client},{https}"), https, files)
            }
            _ => (client.clone(), client, Vec::new()),
        };
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .expect("open the etcd log");
        let binary = std::env::var(ETCD_BINARY_ENV).unwrap_or_else(|_| "etcd".to_owned());
        let child = Command::new(&binary)
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(self.member_dir(i))
            .args(["--listen-client-urls", &listen])
            .args(["--advertise-client-urls", &advertise])
            .args(tls)
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            .arg("--heartbeat-interval")
            .arg(HEARTBEAT.as_millis().to_string())
            .arg("--election-timeout")
            .arg(ETCD_ELECTION_TIMEOUT.as_millis().to_string())
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run `{binary}` (install etcd-server, or set {ETCD_BINARY_ENV}): {e}")
            });
        // Kills the member (and removes the data) once this test process is gone, for the
        // clusters kept in statics.
        let script = format!(
            "while kill -0 {parent} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
             kill -9 {pid} 2>/dev/null; kill -0 {parent} 2>/dev/null || rm -rf '{dir}'",
            parent = std::process::id(),
            pid = child.id(),
            dir = self.dir.path().display(),
        );
        let watchdog = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok();
        let member = &mut self.members[i];
        member.child = Some(child);
        member.watchdog = watchdog;
    }

    /// Waits until each member of `which` answers `/health` with `true`.
    fn wait_healthy(&mut self, which: Vec<usize>, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            for &i in &which {
                if let Some(child) = self.members[i].child.as_mut()
                    && let Ok(Some(status)) = child.try_wait()
                {
                    return Err(format!(
                        "member {i} exited ({status}):\n{}",
                        self.log_tail(i)
                    ));
                }
            }
            if which.iter().all(|&i| self.healthy(i)) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let tails: String = which.iter().map(|&i| self.log_tail(i)).collect();
                return Err(format!("not healthy within {timeout:?}:\n{tails}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_tail(&self, i: usize) -> String {
        let log = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n");
        format!("[{}]\n{tail}\n", self.members[i].name)
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i`'s client port.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// Every member's client endpoint, `http://127.0.0.1:PORT` (`https://` on the TLS port
    /// with TLS).
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| match m.tls_port {
                Some(port) => format!("https://127.0.0.1:{port}"),
                None => format!("http://127.0.0.1:{}", m.client_port),
            })
            .collect()
    }

    /// Member `i`'s TLS client port (with [`start_tls`](Self::start_tls)).
    pub fn tls_port(&self, i: usize) -> Option<u16> {
        self.members[i].tls_port
    }

    /// Whether member `i` answers `/health` with `true` (it is up and has a leader).
    pub fn healthy(&self, i: usize) -> bool {
        http(self.client_port(i), "GET", "/health", "")
            .is_some_and(|body| body.contains("\"health\":\"true\""))
    }

    /// The index of the current leader, as the first member that answers says.
    pub fn leader(&self) -> Option<usize> {
        let ids: Vec<Option<String>> = (0..self.len())
            .map(|i| {
                let status = http(self.client_port(i), "POST", "/v3/maintenance/status", "{}")?;
                Some((
                    json_str(&status, "member_id")?,
                    json_str(&status, "leader")?,
                ))
            })
            .map(|s| s.map(|(member, leader)| format!("{member}/{leader}")))
            .collect();
        let leader_id = ids
            .iter()
            .flatten()
            .find_map(|s| s.split_once('/').map(|(_, l)| l.to_owned()))?;
        ids.iter().position(|s| {
            s.as_ref()
                .is_some_and(|s| s.starts_with(&format!("{leader_id}/")))
        })
    }

    /// Kills member `i` (SIGKILL) and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(mut watchdog) = self.members[i].watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }

    /// Starts killed member `i` again on its ports and data; returns once it is healthy.
    pub fn restart(&mut self, i: usize) {
        assert!(self.members[i].child.is_none(), "member {i} is running");
        self.spawn(i);
        if let Err(why) = self.wait_healthy(vec![i], READY_TIMEOUT) {
            panic!("member {i} did not come back: {why}");
        }
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) member `i`.
    pub fn freeze(&self, i: usize, frozen: bool) {
        if let Some(child) = &self.members[i].child {
            let signal = if frozen {
                Signal::SIGSTOP
            } else {
                Signal::SIGCONT
            };
            kill(pid(child), signal).expect("signal etcd");
        }
    }

    /// How many keys exist from `key` up to `range_end` (exclusive; empty: `key` alone), as a
    /// member that answers says (linearizable read).
    pub fn count(&self, key: &str, range_end: Option<&[u8]>) -> usize {
        let mut body = format!(
            "{{\"key\":\"{}\",\"count_only\":true",
            base64(key.as_bytes())
        );
        if let Some(end) = range_end {
            let _ = write!(body, ",\"range_end\":\"{}\"", base64(end));
        }
        body.push('}');
        for i in 0..self.len() {
            if self.members[i].child.is_none() {
                continue;
            }
            if let Some(resp) = http(self.client_port(i), "POST", "/v3/kv/range", &body)
                && resp.contains("\"header\"")
            {
                return json_str(&resp, "count").map_or(0, |c| c.parse().unwrap_or(0));
            }
        }
        panic!("no etcd member answered a range request");
    }

    /// Whether `key` exists.
    pub fn exists(&self, key: &str) -> bool {
        self.count(key, None) > 0
    }

    /// How many keys start with `prefix`.
    pub fn count_prefix(&self, prefix: &str) -> usize {
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        self.count(prefix, Some(&end))
    }

    /// Turns authentication on with one user, `root` (etcd's administrator), and `password`.
    /// The harness's own reads ([`count`](Self::count) and the like) need no password only
    /// before this.
    pub fn enable_auth(&self, password: &str) {
        let port = self.client_port(0);
        let steps = [
            ("/v3/auth/role/add", "{\"name\":\"root\"}".to_owned()),
            (
                "/v3/auth/user/add",
                format!("{{\"name\":\"root\",\"password\":\"{password}\"}}"),
            ),
            (
                "/v3/auth/user/grant",
                "{\"user\":\"root\",\"role\":\"root\"}".to_owned(),
            ),
            ("/v3/auth/enable", "{}".to_owned()),
        ];
        for (path, body) in steps {
            let answer = http(port, "POST", path, &body);
            assert!(
                answer.as_ref().is_some_and(|a| a.contains("\"header\"")),
                "{path}: {answer:?}"
            );
        }
    }

    /// How many watchers the members serve together (all clients, all keys): a client watches
    /// through the member it prefers, which moves on from one that was slow to answer.
    pub fn watchers(&self) -> u64 {
        (0..self.members.len())
            .map(|i| self.metric(i, "etcd_debugging_mvcc_watcher_total", "") as u64)
            .sum()
    }

    /// The sum of a Prometheus counter or gauge over member `i`'s series whose labels contain
    /// `label` (empty: all).
    pub fn metric(&self, i: usize, name: &str, label: &str) -> f64 {
        let Some(text) = http(self.client_port(i), "GET", "/metrics", "") else {
            return 0.0;
        };
        text.lines()
            .filter(|l| {
                l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains(label)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl EtcdCluster {
    /// A POST to the first member that answers it (with a response `header`); panics if none does.
    fn post_anywhere(&self, path: &str, body: &str) -> String {
        (0..self.len())
            .filter(|&i| self.members[i].child.is_some())
            .find_map(|i| {
                http(self.client_port(i), "POST", path, body).filter(|r| r.contains("\"header\""))
            })
            .unwrap_or_else(|| panic!("no etcd member answered {path}"))
    }

    /// The cluster's current revision.
    pub fn revision(&self) -> i64 {
        let body = format!("{{\"key\":\"{}\",\"count_only\":true}}", base64(b"\0"));
        let answer = self.post_anywhere("/v3/kv/range", &body);
        json_str(&answer, "revision")
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("no revision in {answer}"))
    }

    /// Compacts the history up to the current revision (physically: watches that start at an
    /// older revision are told it is compacted). Returns that revision.
    pub fn compact(&self) -> i64 {
        let revision = self.revision();
        let body = format!("{{\"revision\":\"{revision}\",\"physical\":true}}");
        self.post_anywhere("/v3/kv/compaction", &body);
        revision
    }

    /// Revokes the lease `key` is bound to, as another client (an operator) would: the key is
    /// deleted with it. `false` when the key does not exist or has no lease.
    pub fn revoke_lease_of(&self, key: &str) -> bool {
        let body = format!("{{\"key\":\"{}\"}}", base64(key.as_bytes()));
        let answer = self.post_anywhere("/v3/kv/range", &body);
        let Some(lease) = json_str(&answer, "lease") else {
            return false;
        };
        self.post_anywhere("/v3/lease/revoke", &format!("{{\"ID\":\"{lease}\"}}"));
        true
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            // A frozen member must be thawed to die promptly. One that exited at start (and was
            // reaped while its health was awaited) has no process left: that SIGCONT fails with
            // ESRCH, which is no reason to panic in the middle of a retried start.
            if let Some(child) = &self.members[i].child {
                let _ = kill(pid(child), Signal::SIGCONT);
            }
            self.kill(i);
        }
    }
}

/// `child`'s process id, as `kill` takes it.
fn pid(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"))
}

/// One HTTP/1.0 request to 127.0.0.1:`port` (the answer is not chunked); the body, or None.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).ok()?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(HTTP_TIMEOUT)).ok()?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| body.to_owned())
}

/// The string value of the first `"field":"value"` in `json`.
fn json_str(json: &str, field: &str) -> Option<String> {
    let at = json.find(&format!("\"{field}\":\""))? + field.len() + 4;
    let rest = &json[at..];
    Some(rest[..rest.find('"')?].to_owned())
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (k, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if k <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// An etcd cluster as the behaviour suite reads it: one store however many members it has (its
/// reads are linearizable), with the proxy its lock clients talk through, which counts their
/// requests.
#[derive(Debug)]
pub struct EtcdStore {
    cluster: &'static EtcdCluster,
    proxy: FaultProxy,
}

impl EtcdStore {
    /// The store of `cluster`, whose lock clients talk to it through `proxy`.
    pub fn new(cluster: &'static EtcdCluster, proxy: FaultProxy) -> EtcdStore {
        EtcdStore { cluster, proxy }
    }
}

impl LockStore for EtcdStore {
    fn holds(&self, name: &str) -> bool {
        self.cluster.exists(&etcd_key(name))
    }

    fn holds_none_under(&self, prefix: &str, but: Option<&str>) -> bool {
        let want = but.map_or(0, |k| usize::from(self.cluster.exists(&etcd_key(k))));
        self.cluster.count_prefix(&etcd_key(prefix)) == want
    }

    /// A new watcher. etcd counts watchers per member (summed here), not per key: on a shared
    /// cluster another check's watcher can pass for this one (checks whose waiters must line up
    /// in order run alone); the waiter then still retries right after its own watch is
    /// confirmed, so a release is never missed, only less strictly timed. A watcher that was
    /// ending (an earlier waiter's, which etcd drops a moment after its stream closed) would hide
    /// the new one: counted from the fewest seen.
    fn listening(&self, _name: &str) -> Box<dyn FnMut() -> bool + Send + '_> {
        let mut fewest = self.cluster.watchers();
        Box::new(move || {
            let now = self.cluster.watchers();
            fewest = fewest.min(now);
            now > fewest
        })
    }

    /// Wide: three members that fsync every write answer slowly on a loaded machine, and a waiter
    /// only watches once its first attempt was refused.
    fn listen_timeout(&self) -> Duration {
        Duration::from_secs(15)
    }

    /// Request bytes sent by the clients through the proxy.
    fn lock_requests(&self) -> u64 {
        self.proxy.bytes_up()
    }

    fn script_calls(&self) -> Option<u64> {
        None
    }

    fn command_calls(&self, _command: &str) -> Option<u64> {
        None
    }

    /// 2 s: a renewal is a keepalive and a read each committed by fsyncing members (on three
    /// members under load, a renewal that must land within a few hundred milliseconds makes a
    /// flake, not a finding).
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    /// etcd's leases count whole seconds and its lessor expires them on a 500 ms tick.
    fn expiry_granularity(&self) -> Duration {
        Duration::from_millis(1500)
    }
}

/// The etcd key of lock `name` under the default prefix `lock:` (also of a name's beginning: the
/// keys of the locks whose names start with `name` start with it).
pub fn etcd_key(name: &str) -> String {
    lock_runtime::layout::etcd_key("lock:", name)
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foo"), "Zm9v");
        assert_eq!(super::base64(b"lock:a"), "bG9jazph");
    }
}
