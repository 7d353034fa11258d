//! The listener thread behind the ops and admin endpoints: accepts on a
//! non-blocking socket (so that it notices when to stop), hands each
//! connection to a handler, and stops when dropped.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// A running listener; stops (and joins its thread) when dropped.
#[derive(Debug)]
pub struct Listener {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    /// Binds `addr` and answers each connection with `handle` on a thread
    /// named `name`; a handler's error is logged at debug and the next
    /// connection served.
    pub fn spawn<H>(name: &str, addr: SocketAddr, mut handle: H) -> std::io::Result<Self>
    where
        H: FnMut(TcpStream, SocketAddr) -> std::io::Result<()> + Send + 'static,
    {
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
                            let answered = stream
                                .set_nonblocking(false)
                                .and_then(|()| handle(stream, peer));
                            if let Err(e) = answered {
                                tracing::debug!(listener = %label, error = %e, "request");
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
