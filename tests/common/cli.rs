//! Running the grflow binary from an integration test.

use std::process::{Command, Output};

pub fn grflow() -> Command {
    Command::new(env!("CARGO_BIN_EXE_grflow"))
}

/// `out`, after asserting the command succeeded (its output in the message).
pub fn ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "grflow failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
