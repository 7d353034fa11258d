//! A request to stop a long command early, set from a signal handler: a
//! replay's sources stop reading and the job answers what it read, then
//! ends; `train-allocator` and `send` stop at their next step and report.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

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

/// How soon after the first signal another one counts as the same one:
/// GNU `timeout` passes a signal on twice, to its child and to its process
/// group, microseconds apart, while a person's second Ctrl-C comes later.
pub const REPEAT_WINDOW_NS: u64 = 200_000_000;

/// What a signal handler does with a signal that came at `now_ns`, the
/// first having come at `first_ns` (0: none yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OnSignal {
    /// The first: ask the job to stop.
    Stop,
    /// The first passed on again (see [`REPEAT_WINDOW_NS`]).
    Ignore,
    /// A second: exit at once.
    Exit,
}

fn on_signal(first_ns: u64, now_ns: u64) -> OnSignal {
    match first_ns {
        0 => OnSignal::Stop,
        first if now_ns.saturating_sub(first) < REPEAT_WINDOW_NS => OnSignal::Ignore,
        _ => OnSignal::Exit,
    }
}

/// CLOCK_MONOTONIC in ns, at least 1 (0 means "no signal yet").
/// `clock_gettime` is async-signal-safe.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; the clock id is a constant.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
        .max(1)
}

/// On the first of `signals`, sets `flag` (and `signal`, when given, to
/// its number) so that the job drains and ends; a second one exits the
/// process at once with `exit_code(signal)`. A repeat within
/// [`REPEAT_WINDOW_NS`] of the first is the same signal passed on twice
/// (`timeout`), not a second one: exiting then lost every output.
pub fn on_signals(
    signals: &[i32],
    flag: Arc<AtomicBool>,
    signal: Option<Arc<AtomicUsize>>,
    exit_code: fn(i32) -> i32,
) -> std::io::Result<()> {
    let first = Arc::new(AtomicU64::new(0));
    for &sig in signals {
        let (first, flag, signal) = (first.clone(), flag.clone(), signal.clone());
        let handler = move || {
            let now = monotonic_ns();
            let seen = first
                .compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst)
                .err()
                .unwrap_or(0);
            match on_signal(seen, now) {
                OnSignal::Stop => {
                    if let Some(s) = &signal {
                        s.store(sig as usize, Ordering::SeqCst);
                    }
                    flag.store(true, Ordering::SeqCst);
                }
                OnSignal::Ignore => {}
                OnSignal::Exit => signal_hook::low_level::exit(exit_code(sig)),
            }
        };
        // SAFETY: the handler only touches atomics, reads the clock and
        // calls `_exit`, all async-signal-safe; it allocates nothing.
        unsafe { signal_hook::low_level::register(sig, handler) }?;
    }
    Ok(())
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

    #[test]
    fn a_signal_passed_on_twice_is_one_signal_and_a_later_one_exits() {
        assert_eq!(on_signal(0, 5), OnSignal::Stop);
        assert_eq!(on_signal(1_000, 1_000 + 50_000), OnSignal::Ignore);
        assert_eq!(on_signal(1_000, 1_000 + REPEAT_WINDOW_NS), OnSignal::Exit);
        // A clock read before the first signal's (another thread) ignores.
        assert_eq!(on_signal(1_000, 900), OnSignal::Ignore);
        assert!(monotonic_ns() >= 1);
    }

    #[test]
    fn installed_handlers_take_a_repeated_signal_as_one() {
        use signal_hook::consts::SIGUSR2;
        let flag = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(AtomicUsize::new(0));
        on_signals(&[SIGUSR2], flag.clone(), Some(signal.clone()), |s| 128 + s).unwrap();
        signal_hook::low_level::raise(SIGUSR2).unwrap();
        // Passed on again at once: the process goes on (an exit would end
        // the test binary and fail the run).
        signal_hook::low_level::raise(SIGUSR2).unwrap();
        assert!(flag.load(Ordering::SeqCst));
        assert_eq!(signal.load(Ordering::SeqCst), SIGUSR2 as usize);
    }
}
