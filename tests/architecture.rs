//! ARCHITECTURE.md describes the code as it is: every repository path it
//! names in backticks exists, so the file cannot silently drift from the tree.

use std::path::Path;

/// Backticked spans that look like paths inside the repository: they
/// contain a `/` and no spaces, and do not point outside it.
fn named_paths(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.contains('/') && !s.contains(' ') && !s.starts_with("../"))
        .map(|s| s.trim_end_matches('/').to_string())
        .collect()
}

#[test]
fn every_path_architecture_md_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let paths = named_paths(&text);
    assert!(paths.len() >= 20, "only {} paths found", paths.len());
    let missing: Vec<&String> = paths.iter().filter(|p| !root.join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

#[test]
fn the_path_scanner_finds_paths_and_skips_prose() {
    let text = "see `a/b.rs` and `x`, `../shared/c.md`, `pipeline/` and `not a/path`";
    assert_eq!(named_paths(text), ["a/b.rs", "pipeline"]);
}
