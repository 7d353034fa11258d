//! A skip announced by the helper reaches `cargo test` output of a passing
//! test, where `eprintln!` does not. The check runs this test binary again
//! as a child on one fixture test, as `cargo test` runs it (output
//! captured), and reads the child's stderr.

use std::process::Command;

const CHILD: &str = "GRFLOW_TESTKIT_SKIP_CHILD";
const MISSING: &str = "no-such-dataset/none.csv";

/// Fixture for the test below; does nothing unless run by it.
#[test]
fn fixture_data_test_without_its_data() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    eprintln!("captured-by-the-harness");
    assert!(grflow_testkit::shared_data("fixture_data_test_without_its_data", MISSING).is_none());
}

#[test]
fn a_skip_shows_in_cargo_test_output() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "fixture_data_test_without_its_data"])
        .env(CHILD, "1")
        .env_remove(grflow_testkit::DATA_DIR_ENV)
        .env_remove("RUST_TEST_NOCAPTURE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("test fixture_data_test_without_its_data ... ok"),
        "{stdout}"
    );
    // The harness swallows eprintln! of a passing test: the reason for the
    // helper. The helper's skip line is there, naming test and file.
    assert!(!stderr.contains("captured-by-the-harness"), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("skipping fixture_data_test_without_its_data: "))
        .unwrap_or_else(|| panic!("no skip line in {stderr}"));
    assert!(line.contains(MISSING), "{line}");
}
