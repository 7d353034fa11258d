//! A skip that shows in `cargo test` output, as grflow-testkit's `skip()`
//! does it (the root package does not depend on testkit: adding it would
//! change Cargo.lock), and the check that a test binary's skips show.

#![allow(dead_code)] // each test binary uses a different part

use std::ffi::OsStr;
use std::io::Write;
use std::process::Command;

/// Announces that `test` is skipped, and why. Written to the process's
/// stderr handle, not through `eprintln!`: the test harness captures the
/// print macros of passing tests, so a skip through them is never seen.
pub fn skip(test: &str, reason: &str) {
    let _ = writeln!(std::io::stderr(), "skipping {test}: {reason}");
}

/// Runs this test binary again as `cargo test` runs it (output captured),
/// every test but `checker`, with `env` set (`None`: removed) so that each
/// test skips, and asserts that each test that passed printed a skip line
/// naming it: a skip nobody sees, or one under another test's name, fails.
pub fn assert_every_test_skips_visibly(checker: &str, env: &[(&str, Option<&OsStr>)]) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "--skip", checker])
        .env_remove("RUST_TEST_NOCAPTURE");
    for (key, value) in env {
        match value {
            Some(v) => cmd.env(key, v),
            None => cmd.env_remove(key),
        };
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let passed: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("test ")?.strip_suffix(" ... ok"))
        .collect();
    assert!(!passed.is_empty(), "no test ran:\n{stdout}");
    for test in passed {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("skipping {test}: "))),
            "{test} passed without a visible skip line:\n{stderr}"
        );
    }
}
