//! The listener thread behind the ops and admin endpoints: accepts on a
//! non-blocking socket (so that it notices when to stop), answers each
//! connection on a thread of its own (one slow client must not hold up a
//! liveness probe), and stops when dropped. [`read_head`] reads a request's
//! head within one deadline and a size bound.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Connections answered at once; past this a new one is closed unanswered.
const MAX_CONNECTIONS: usize = 32;
/// The most bytes a request's line and headers may take.
pub const MAX_HEAD_BYTES: u64 = 16 * 1024;

/// A request's line and the headers the endpoints use.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Head {
    pub method: String,
    pub path: String,
    /// `Content-Length`, None when absent.
    pub content_length: Option<usize>,
    /// `Host`, None when absent.
    pub host: Option<String>,
    /// `Origin` (sent by browsers), None when absent.
    pub origin: Option<String>,
}

/// Why a request's head could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error("request head over {MAX_HEAD_BYTES} bytes")]
    TooLarge,
    #[error("bad Content-Length {0:?}")]
    BadLength(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A stream whose every read ends by one deadline: a client that sends a
/// byte just before each read would time out would otherwise never end.
#[derive(Debug)]
pub struct DeadlineStream {
    stream: TcpStream,
    deadline: Instant,
}

impl Read for DeadlineStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// Reads the request line and headers from `stream`, all of them before
/// `deadline`, and at most [`MAX_HEAD_BYTES`]: a client that sends a byte a
/// second, or one endless line, is cut off instead of holding a thread or
/// growing memory. Returns the reader, positioned at the body (bounded by
/// `Content-Length` and the same deadline).
pub fn read_head(
    stream: &TcpStream,
    deadline: Instant,
) -> Result<(Head, BufReader<std::io::Take<DeadlineStream>>), HeadError> {
    let timed = DeadlineStream {
        stream: stream.try_clone()?,
        deadline,
    };
    let mut reader = BufReader::new(timed.take(MAX_HEAD_BYTES));
    let mut read_line = |line: &mut String| -> Result<usize, HeadError> {
        let n = reader.read_line(line)?;
        if n > 0 && !line.ends_with('\n') {
            // Cut off by the size bound (or the client went away mid-line).
            return Err(HeadError::TooLarge);
        }
        Ok(n)
    };
    let mut line = String::new();
    read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let mut head = Head {
        method: parts.next().unwrap_or("").to_string(),
        path: parts.next().unwrap_or("").to_string(),
        content_length: None,
        host: None,
        origin: None,
    };
    let mut header = String::new();
    while read_line(&mut header)? > 2 {
        if let Some((k, v)) = header.split_once(':') {
            let (k, v) = (k.trim(), v.trim());
            if k.eq_ignore_ascii_case("content-length") {
                head.content_length = Some(v.parse().map_err(|_| HeadError::BadLength(v.into()))?);
            } else if k.eq_ignore_ascii_case("host") {
                head.host = Some(v.to_string());
            } else if k.eq_ignore_ascii_case("origin") {
                head.origin = Some(v.to_string());
            }
        }
        header.clear();
    }
    // The body is bounded by its length, not by the head's limit (what the
    // buffer holds already counts against neither).
    let limit = head.content_length.unwrap_or(0) as u64;
    reader.get_mut().set_limit(limit);
    Ok((head, reader))
}

/// How long, and for how many bytes, a connection is drained after its
/// answer ([`linger`]).
const LINGER: Duration = Duration::from_millis(500);
const LINGER_BYTES: u64 = 1024 * 1024;

/// Closes a connection whose answer has been written without losing that
/// answer: closing a socket with unread input makes the kernel reset the
/// connection, which drops whatever of the answer the client has not read
/// yet (a refused head or an unread body leaves such input). So the write
/// side is shut first (the client sees the answer end) and the input is
/// read away, for a bounded time and size, before the socket is dropped.
fn linger(stream: TcpStream) {
    if stream.shutdown(std::net::Shutdown::Write).is_err() {
        return;
    }
    let deadline = Instant::now() + LINGER;
    let mut rest = DeadlineStream { stream, deadline }.take(LINGER_BYTES);
    let _ = std::io::copy(&mut rest, &mut std::io::sink());
}

/// A running listener; stops (and joins its thread) when dropped.
#[derive(Debug)]
pub struct Listener {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    /// Binds `addr` and answers each connection with `handle` on a thread
    /// of its own (accepting on a thread named `name`); a handler's error is
    /// logged at debug.
    pub fn spawn<H>(name: &str, addr: SocketAddr, handle: H) -> std::io::Result<Self>
    where
        H: Fn(TcpStream, SocketAddr) -> std::io::Result<()> + Send + Sync + 'static,
    {
        let handle = Arc::new(handle);
        let active = Arc::new(AtomicUsize::new(0));
        let listener = TcpListener::bind(addr)?;
        let local = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let label = name.to_string();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, peer)) => {
                            if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                                active.fetch_sub(1, Ordering::AcqRel);
                                tracing::debug!(listener = %label, %peer, "too many connections");
                                continue;
                            }
                            let (handle, slot, label) =
                                (handle.clone(), active.clone(), label.clone());
                            // Detached: a client that stalls cannot hold up
                            // the others, nor the process's exit.
                            let spawned = std::thread::Builder::new()
                                .name(format!("{label}-conn"))
                                .spawn(move || {
                                    let kept = stream.try_clone();
                                    let answered = stream
                                        .set_nonblocking(false)
                                        .and_then(|()| handle(stream, peer));
                                    if let Err(e) = answered {
                                        tracing::debug!(listener = %label, error = %e, "request");
                                    }
                                    if let Ok(kept) = kept {
                                        linger(kept);
                                    }
                                    slot.fetch_sub(1, Ordering::AcqRel);
                                });
                            if let Err(e) = spawned {
                                active.fetch_sub(1, Ordering::AcqRel);
                                tracing::warn!(error = %e, "spawning a connection thread");
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(e) => {
                            tracing::warn!(listener = %label, error = %e, "accept");
                            std::thread::sleep(Duration::from_millis(200));
                        }
                    }
                }
            })?;
        Ok(Self {
            addr: local,
            stop,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A listener whose handler answers the head it read, or why not.
    fn echo() -> Listener {
        Listener::spawn("test-http", "127.0.0.1:0".parse().unwrap(), |stream, _| {
            let deadline = Instant::now() + Duration::from_secs(2);
            let answer = match read_head(&stream, deadline) {
                Ok((head, _)) => format!("{} {} {:?}", head.method, head.path, head.content_length),
                Err(e) => format!("refused: {e}"),
            };
            let mut stream = stream;
            stream.write_all(answer.as_bytes())
        })
        .unwrap()
    }

    fn ask(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(request);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn a_slow_client_does_not_hold_up_the_next_one() {
        let l = echo();
        // Sends a byte and then nothing for longer than the next asks take.
        let mut slow = TcpStream::connect(l.local_addr()).unwrap();
        slow.write_all(b"G").unwrap();
        let started = Instant::now();
        let answer = ask(l.local_addr(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(answer, "GET /healthz None");
        assert!(
            started.elapsed() < Duration::from_millis(1_000),
            "{:?}",
            started.elapsed()
        );
        drop(slow);
    }

    #[test]
    fn an_endless_head_is_cut_off_at_the_bound_and_a_bad_length_refused() {
        let l = echo();
        let mut endless = b"GET /".to_vec();
        endless.extend(std::iter::repeat_n(b'a', 1 << 20));
        assert_eq!(
            ask(l.local_addr(), &endless),
            format!("refused: request head over {MAX_HEAD_BYTES} bytes")
        );
        let answer = ask(
            l.local_addr(),
            b"POST /model HTTP/1.1\r\nContent-Length: lots\r\n\r\n",
        );
        assert_eq!(answer, "refused: bad Content-Length \"lots\"");
        let answer = ask(
            l.local_addr(),
            b"POST /model HTTP/1.1\r\ncontent-length: 12\r\n\r\n/models/next",
        );
        assert_eq!(answer, "POST /model Some(12)");
    }

    #[test]
    fn an_answer_reaches_a_client_that_sent_more_than_was_read() {
        // The handler answers after the request line alone; the rest of the
        // request stays unread. Closing then would reset the connection and
        // drop the answer's tail still in flight (larger than the buffers).
        const ANSWER: usize = 8 << 20;
        let l = Listener::spawn("test-linger", "127.0.0.1:0".parse().unwrap(), |s, _| {
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line)?;
            (&s).write_all(&vec![b'a'; ANSWER])
        })
        .unwrap();
        let mut s = TcpStream::connect(l.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        s.write_all(&[b'h'; 64 << 10]).unwrap();
        // Let the handler finish writing what the buffers hold first.
        std::thread::sleep(Duration::from_millis(200));
        let mut out = Vec::new();
        let read = s.read_to_end(&mut out);
        assert!(read.is_ok(), "{read:?} after {} bytes", out.len());
        assert_eq!(out.len(), ANSWER);
    }

    #[test]
    fn a_head_not_finished_by_the_deadline_times_out() {
        let l = echo();
        let mut s = TcpStream::connect(l.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let started = Instant::now();
        // A byte every 300 ms: each read is quick, the head never ends.
        let mut writer = s.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..12 {
                if writer.write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("refused:"), "{out:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
}
