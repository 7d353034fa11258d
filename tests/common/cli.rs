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

/// Runs `args --out OUT` and asserts it was refused up front: exit 2 within
/// 5 s, naming `--out` and the path, nothing printed on stdout. The stderr.
#[allow(dead_code)] // not every test binary uses it
pub fn refused_out(args: &[&str], out: &std::path::Path) -> String {
    let started = std::time::Instant::now();
    let run = grflow().args(args).arg("--out").arg(out).output().unwrap();
    let err = String::from_utf8_lossy(&run.stderr).to_string();
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--out") && err.contains(&*out.to_string_lossy()),
        "{err}"
    );
    assert!(run.stdout.is_empty(), "nothing was measured");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    err
}
