//! Signals to a child process, as a user's `kill` would send them.

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
