//! Child processes under test: waiting for what they write, and signals
//! as a user's `kill` would send them.

#![allow(dead_code)] // not every test binary signals

/// Sends `sig` (`-INT`, `-TERM`, `-STOP`, ...) to process `pid`; panics if
/// `kill` fails.
pub fn signal(pid: u32, sig: &str) {
    let pid = pid.to_string();
    let status = std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap();
    assert!(status.success(), "kill {sig} {pid}");
}

/// Waits until `path` exists (a child has begun writing it); panics with
/// `what` after `within`.
pub fn wait_for_file(path: &std::path::Path, within: std::time::Duration, what: &str) {
    let started = std::time::Instant::now();
    while !path.exists() {
        assert!(started.elapsed() < within, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
