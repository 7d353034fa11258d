//! Dev-only helpers shared by the tests of every grflow crate: where the
//! real datasets are, and a skip that shows in `cargo test` output.
//!
//! The datasets are research data that never enter the repository. They are
//! read from `$GRFLOW_DATA_DIR` when set, else from `../shared/data` beside
//! the repository; a test whose file is missing passes after announcing its
//! skip.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The environment variable naming the dataset folder.
pub const DATA_DIR_ENV: &str = "GRFLOW_DATA_DIR";

/// The line [`skip`] prints.
pub fn skip_message(test: &str, reason: &str) -> String {
    format!("skipping {test}: {reason}")
}

/// Announces that `test` is skipped. Written to the process's stderr
/// handle, not through `eprintln!`: the test harness captures the print
/// macros of passing tests, so a skip through them is never seen.
pub fn skip(test: &str, reason: &str) {
    let _ = writeln!(std::io::stderr(), "{}", skip_message(test, reason));
}

/// The folder of the shared datasets.
pub fn data_dir() -> PathBuf {
    match std::env::var_os(DATA_DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        // testkit/ sits in the repository root; ../shared/data beside it.
        _ => Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .nth(2)
            .unwrap_or(Path::new("/"))
            .join("shared/data"),
    }
}

/// The dataset file `rel` (e.g. `ml-100k/ml-100k.inter`), or `None` after
/// announcing that `test` is skipped because it is missing.
pub fn shared_data(test: &str, rel: &str) -> Option<PathBuf> {
    let path = data_dir().join(rel);
    if path.is_file() {
        return Some(path);
    }
    skip(
        test,
        &format!(
            "{} not found (datasets live in ../shared/data or ${DATA_DIR_ENV})",
            path.display()
        ),
    );
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_test_and_the_reason() {
        assert_eq!(
            skip_message("t", "no broker"),
            "skipping t: no broker".to_string()
        );
    }
}
