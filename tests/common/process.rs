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

/// A child process that is killed (SIGKILL) and reaped when dropped, so
/// that a test that fails half way leaves nothing running.
#[derive(Debug)]
pub struct Reaped(Option<std::process::Child>);

impl Reaped {
    pub fn spawn(cmd: &mut std::process::Command) -> Self {
        Self(Some(cmd.spawn().expect("spawn the child")))
    }

    pub fn child(&mut self) -> &mut std::process::Child {
        self.0.as_mut().expect("not waited for yet")
    }

    pub fn id(&self) -> u32 {
        self.0.as_ref().expect("not waited for yet").id()
    }

    /// Waits for the child to exit on its own; its output.
    pub fn wait_with_output(mut self) -> std::process::Output {
        let child = self.0.take().expect("not waited for yet");
        child.wait_with_output().expect("wait for the child")
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
