//! The commands clients sent one server, from `MONITOR`: what a number of requests is counted
//! from where `INFO commandstats` cannot tell them apart (it also counts the commands a script
//! runs, and a pipeline's commands one by one, while `MONITOR` shows a script's commands as the
//! script's, `[0 lua]`).

// A harness failure should stop the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{self, BufRead as _, BufReader, Write as _};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::server::RedisServer;

/// How long the recording thread blocks on a read before it looks at its stop flag.
const READ_TIMEOUT: Duration = Duration::from_millis(100);
/// How long [`Monitor::stop`] waits for its marker to come back through the monitor.
const MARKER_TIMEOUT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(2);

/// One command a client sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The client's address, `127.0.0.1:port`.
    pub client: String,
    /// The command's name, lowercase.
    pub command: String,
    /// Its arguments, as `MONITOR` wrote them (unquoted; escapes left as they are).
    pub args: Vec<String>,
}

/// The commands sent to one server from [`start`](Self::start) on, recorded by a thread of its
/// own until [`stop`](Self::stop).
#[derive(Debug)]
pub struct Monitor {
    lines: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Starts recording; returns once the server confirmed `MONITOR`. On a server without a
    /// password (`requirepass`).
    pub fn start(server: &RedisServer) -> Monitor {
        let stream = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        (&stream).write_all(b"MONITOR\r\n").unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        let deadline = Instant::now() + MARKER_TIMEOUT;
        // A read that times out keeps what it read in `line`: read on into it.
        while !line.ends_with('\n') {
            assert!(Instant::now() < deadline, "MONITOR unanswered: {line:?}");
            let _ = reader.read_line(&mut line);
        }
        assert_eq!(line, "+OK\r\n", "MONITOR refused");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (lines, stop) = (Arc::clone(&lines), Arc::clone(&stop));
            thread::spawn(move || {
                let mut line = String::new();
                while !stop.load(Ordering::SeqCst) {
                    match reader.read_line(&mut line) {
                        // The server is gone.
                        Ok(0) => return,
                        Ok(_) => {
                            if let Some(status) = line.trim_end().strip_prefix('+') {
                                lines
                                    .lock()
                                    .unwrap_or_else(PoisonError::into_inner)
                                    .push(status.to_owned());
                            }
                            line.clear();
                        }
                        // An idle server: look at the stop flag, then read on.
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                            ) => {}
                        Err(_) => return,
                    }
                }
            })
        };
        Monitor {
            lines,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops once every command sent before this call was recorded (a marker sent after them
    /// came back through the monitor), and answers the commands clients sent, in order: not
    /// those scripts ran, nor the marker.
    pub fn stop(mut self, server: &RedisServer) -> Vec<Sent> {
        let marker = format!("monitor-end-{}", std::process::id());
        let echoed: String = redis::cmd("ECHO")
            .arg(&marker)
            .query(&mut server.admin())
            .unwrap();
        assert_eq!(echoed, marker);
        let deadline = Instant::now() + MARKER_TIMEOUT;
        let quoted = format!("\"{marker}\"");
        while !self.recorded().iter().any(|l| l.ends_with(&quoted)) {
            assert!(
                Instant::now() < deadline,
                "MONITOR did not show the marker within {MARKER_TIMEOUT:?}"
            );
            thread::sleep(POLL);
        }
        self.end();
        self.recorded()
            .iter()
            .filter_map(|line| parse(line))
            .filter(|sent| !sent.args.contains(&marker))
            .collect()
    }

    fn recorded(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn end(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.end();
    }
}

/// A `MONITOR` line, `1733400000.123456 [0 127.0.0.1:5555] "SET" "k" "v"`: `None` for a command a
/// script ran (`[0 lua]`) or a line it cannot read.
fn parse(line: &str) -> Option<Sent> {
    let (_, rest) = line.split_once(" [")?;
    let (db_client, rest) = rest.split_once("] ")?;
    let (_, client) = db_client.split_once(' ')?;
    if client == "lua" {
        return None;
    }
    let mut words = Vec::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut word = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => {
                    word.push(c);
                    word.extend(chars.next());
                }
                c => word.push(c),
            }
        }
        words.push(word);
    }
    let mut words = words.into_iter();
    Some(Sent {
        client: client.to_owned(),
        command: words.next()?.to_lowercase(),
        args: words.collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_reads_as_its_client_command_and_arguments() {
        let sent =
            parse(r#"1733400000.123456 [0 127.0.0.1:5555] "SET" "lock:{a\"b}" "x\x1fy" "GET""#);
        assert_eq!(
            sent,
            Some(Sent {
                client: "127.0.0.1:5555".into(),
                command: "set".into(),
                args: vec![r#"lock:{a\"b}"#.into(), r"x\x1fy".into(), "GET".into()],
            })
        );
        assert_eq!(parse(r#"1733400000.1 [0 lua] "SET" "k""#), None);
    }
}
