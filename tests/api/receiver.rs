//! A real HTTP downstream on 127.0.0.1 for the timing tests of the call-out lane: it reads each
//! POST, records its `Idempotency-Key`, holds the answer for a set time (acting first, as a
//! slow downstream does), then answers with a set status. Plain threads, so that its timing
//! does not depend on the test's runtime. Stopped on drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

#[derive(Default)]
pub struct Seen {
    /// Idempotency keys, in the order the requests arrived.
    pub keys: Mutex<Vec<String>>,
    /// Requests read but not yet answered.
    pub in_flight: AtomicUsize,
    /// The most requests in flight at once.
    pub most_in_flight: AtomicUsize,
    /// Requests answered (or whose answer was abandoned by the caller).
    pub done: AtomicUsize,
    /// Every request whole, in the order they were answered.
    pub calls: Mutex<Vec<Call>>,
    /// TCP connections accepted.
    pub connections: AtomicUsize,
    /// While set, answers wait (up to [`MAX_HOLD`]) after their delay: a test that needs calls
    /// in flight across several steps holds them instead of guessing how long the steps take.
    pub hold: AtomicBool,
}

/// The longest a held answer waits for [`Receiver::release`].
pub const MAX_HOLD: Duration = Duration::from_secs(60);

/// One request as the receiver read it.
#[derive(Debug, Clone)]
pub struct Call {
    /// The request line's target: a path, or a whole URL when the caller took this receiver
    /// for a proxy.
    pub target: String,
    /// Names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// When it was read whole, in ms since the epoch.
    pub read_at: i64,
}

impl Call {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

pub struct Receiver {
    pub url: String,
    pub seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
    port: u16,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    /// Answers `status` after holding each request for `delay`.
    pub fn start(delay: Duration, status: u16) -> Receiver {
        Receiver::start_on(0, delay, status)
    }

    /// [`Receiver::start`] on a given port (0: any).
    pub fn start_on(port: u16, delay: Duration, status: u16) -> Receiver {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Seen::default());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop) = (Arc::clone(&seen), Arc::clone(&stop));
            std::thread::spawn(move || {
                // Bounded: at most this many connections over the receiver's life.
                for stream in listener.incoming().take(1000) {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    seen.connections.fetch_add(1, Ordering::SeqCst);
                    let seen = Arc::clone(&seen);
                    std::thread::spawn(move || serve(stream, &seen, delay, status));
                }
            })
        };
        Receiver {
            url: format!("http://127.0.0.1:{port}/in"),
            seen,
            stop,
            port,
            thread: Some(thread),
        }
    }

    pub fn calls(&self) -> Vec<Call> {
        self.seen.calls.lock().unwrap().clone()
    }

    pub fn keys(&self) -> Vec<String> {
        self.seen.keys.lock().unwrap().clone()
    }

    pub fn in_flight(&self) -> usize {
        self.seen.in_flight.load(Ordering::SeqCst)
    }

    pub fn done(&self) -> usize {
        self.seen.done.load(Ordering::SeqCst)
    }

    pub fn connections(&self) -> usize {
        self.seen.connections.load(Ordering::SeqCst)
    }

    pub fn most_in_flight(&self) -> usize {
        self.seen.most_in_flight.load(Ordering::SeqCst)
    }

    /// Answers wait from now until [`Receiver::release`] (or [`MAX_HOLD`]).
    pub fn hold(&self) {
        self.seen.hold.store(true, Ordering::SeqCst);
    }

    pub fn release(&self) {
        self.seen.hold.store(false, Ordering::SeqCst);
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How many requests one connection serves before the receiver closes it.
pub const REQUESTS_PER_CONNECTION: usize = 100;

/// One connection: requests one after another (keep-alive), each read whole, recorded, held,
/// answered.
fn serve(stream: TcpStream, seen: &Seen, delay: Duration, status: u16) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut writer = stream;
    for _ in 0..REQUESTS_PER_CONNECTION {
        let mut key = String::new();
        let mut length = 0usize;
        let mut headers = Vec::new();
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let target = line.split(' ').nth(1).unwrap_or_default().to_string();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                let (name, value) = (name.trim().to_ascii_lowercase(), value.trim().to_string());
                match name.as_str() {
                    "idempotency-key" => key = value.clone(),
                    "content-length" => length = value.parse().unwrap_or(0),
                    _ => {}
                }
                headers.push((name, value));
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        seen.keys.lock().unwrap().push(key);
        let read_at = now_ms();
        let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        seen.most_in_flight.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(delay);
        let held = std::time::Instant::now();
        while seen.hold.load(Ordering::SeqCst) && held.elapsed() < MAX_HOLD {
            std::thread::sleep(Duration::from_millis(5));
        }
        seen.in_flight.fetch_sub(1, Ordering::SeqCst);
        seen.done.fetch_add(1, Ordering::SeqCst);
        let answer = format!("HTTP/1.1 {status} X\r\ncontent-length: 2\r\n\r\n{{}}");
        let written = writer.write_all(answer.as_bytes());
        seen.calls.lock().unwrap().push(Call {
            target,
            headers,
            body,
            read_at,
        });
        if written.is_err() {
            return;
        }
    }
}

fn now_ms() -> i64 {
    webhook_inbox::domain::time::now_ms()
}

/// Wait (bounded) until `done` holds; panics with `what` when it does not.
pub async fn until(what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if done().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
