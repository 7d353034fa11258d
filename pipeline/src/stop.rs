//! A request to stop a long command early, set from a signal handler: a
//! replay's sources stop reading and the job answers what it read, then
//! ends; `train-allocator` and `send` stop at their next step and report.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Set once; read by every worker's source and, at the end, by the summary.
#[derive(Clone, Debug, Default)]
pub struct StopRequest {
    /// Set when the job should stop reading. A signal handler may set it
    /// directly (`signal_hook::flag::register`).
    pub flag: Arc<AtomicBool>,
    /// The signal number that asked (0: none, or not a signal), for the
    /// summary (`signal_hook::flag::register_usize`).
    pub signal: Arc<AtomicUsize>,
    /// Set when another process of the cluster stopped. Apart from `flag`,
    /// which the handlers read to make a second signal exit at once: a
    /// peer's stop is not this process's first signal, so the first one
    /// it gets still drains and writes its outputs.
    peer: Arc<AtomicBool>,
}

impl StopRequest {
    /// Asks the job to stop, as a signal handler would.
    pub fn request(&self, signal: usize) {
        self.signal.store(signal, Ordering::Relaxed);
        self.flag.store(true, Ordering::Relaxed);
    }

    /// Another worker stopped (its process got `signal`): stop too, naming
    /// the signal unless this process got one of its own.
    pub fn request_from_peer(&self, signal: usize) {
        let _ = self
            .signal
            .compare_exchange(0, signal, Ordering::Relaxed, Ordering::Relaxed);
        self.peer.store(true, Ordering::Relaxed);
    }

    /// The signal number that asked (0: none yet, or not a signal).
    pub fn signal(&self) -> usize {
        self.signal.load(Ordering::Relaxed)
    }

    pub fn requested(&self) -> bool {
        self.flag.load(Ordering::Relaxed) || self.peer.load(Ordering::Relaxed)
    }

    /// What asked, as the summary names it.
    pub fn cause(&self) -> String {
        signal_name(self.signal())
    }
}

/// "SIGINT" for 2, "SIGTERM" for 15 (the two a replay stops on), "signal N"
/// for others and "a stop request" for 0.
pub fn signal_name(signal: usize) -> String {
    match signal {
        0 => "a stop request".into(),
        2 => "SIGINT".into(),
        15 => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_sets_the_flag_and_names_its_signal() {
        let stop = StopRequest::default();
        assert!(!stop.requested());
        assert_eq!(stop.cause(), "a stop request");
        let seen_by_a_worker = stop.clone();
        stop.request(2);
        assert!(seen_by_a_worker.requested());
        assert_eq!(seen_by_a_worker.cause(), "SIGINT");
        assert_eq!(signal_name(15), "SIGTERM");
        // A peer's news does not rename a stop this process asked for...
        stop.request_from_peer(15);
        assert_eq!(stop.cause(), "SIGINT");
        // ...and names the signal where this process got none.
        let peer = StopRequest::default();
        peer.request_from_peer(15);
        assert!(peer.requested());
        assert_eq!(peer.cause(), "SIGTERM");
        // Not the flag the handlers read: this process's first signal
        // still asks for a drain rather than an exit.
        assert!(!peer.flag.load(Ordering::Relaxed));
        assert_eq!(signal_name(1), "signal 1");
    }
}
