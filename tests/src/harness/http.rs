//! An HTTP server on 127.0.0.1, for the tests of a Redis URL that points at something else.

// A harness failure should stop the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// What an HTTP server answers to a request it cannot read, such as the RESP commands a Redis
/// client sends when it connects.
const BAD_REQUEST: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n\
Content-Length: 11\r\nConnection: close\r\n\r\nBad Request";

/// Listens on a free 127.0.0.1 port and answers every connection's first read with
/// `400 Bad Request`, then closes it. Stops listening on drop.
#[derive(Debug)]
pub struct HttpServer {
    port: u16,
    stop: Arc<AtomicBool>,
    accepting: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Listens at once: a connection made after this returns is answered.
    pub fn start() -> HttpServer {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .expect("bind the HTTP server on 127.0.0.1:0");
        let port = listener.local_addr().expect("HTTP server address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let accepting = {
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    if let Ok(conn) = conn {
                        thread::spawn(move || answer(conn));
                    }
                }
            })
        };
        HttpServer {
            port,
            stop,
            accepting: Some(accepting),
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`, as a lock error names the node.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

fn answer(mut conn: TcpStream) {
    // Bounded: a client that sends nothing does not keep the thread.
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut request = [0_u8; 4096];
    if conn.read(&mut request).is_ok_and(|n| n > 0) {
        let _ = conn.write_all(BAD_REQUEST);
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept, which then sees `stop`.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
        if let Some(accepting) = self.accepting.take() {
            let _ = accepting.join();
        }
    }
}
