//! README.md and docs/*.md link to each other, to files of the repository
//! and to headings; since benchmark sections move between README and the
//! records in docs/, every relative link must still land: the file exists
//! and, when the link names a heading (`#...`), the file has it.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

/// Targets of inline links `[text](target)`, including links whose text
/// spans lines.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-`
/// and `_` dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown file's headings (fenced code skipped).
fn anchors(text: &str) -> HashSet<String> {
    let mut fenced = false;
    let mut out = HashSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// `path` with its `..` and `.` resolved by name (no file-system access),
/// so that a link leaving the repository is seen to leave it.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files
}

#[test]
fn every_relative_link_of_readme_and_docs_lands() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut broken = Vec::new();
    let mut checked = 0;
    // Headings of each linked file, parsed once.
    let mut headings: HashMap<PathBuf, HashSet<String>> = HashMap::new();
    for file in markdown_files(root) {
        let text = std::fs::read_to_string(&file).unwrap();
        let dir = file.parent().unwrap();
        for target in link_targets(&text) {
            if target.starts_with("http://") || target.starts_with("https://") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let linked = if path.is_empty() {
                file.clone()
            } else {
                lexical(&dir.join(path))
            };
            // Links that leave the repository (../shared: the papers, the
            // plan) are not the repository's to keep.
            if !linked.starts_with(root) {
                continue;
            }
            checked += 1;
            if !linked.exists() {
                broken.push(format!("{}: {target} (no such file)", file.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let known = headings
                    .entry(linked.clone())
                    .or_insert_with(|| anchors(&std::fs::read_to_string(&linked).unwrap()));
                if !known.contains(anchor) {
                    broken.push(format!("{}: {target} (no such heading)", file.display()));
                }
            }
        }
    }
    assert!(checked >= 10, "only {checked} relative links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_follow_github_s_rule() {
    assert_eq!(
        slug(" `grflow bench serve --json --out DIR` (hstu-3l, 200 ms p99 SLO, 2 workers)"),
        "grflow-bench-serve---json---out-dir-hstu-3l-200-ms-p99-slo-2-workers"
    );
    assert_eq!(
        slug(" The allocator (`[allocator]`)"),
        "the-allocator-allocator"
    );
    assert_eq!(
        link_targets("see [a\nb](docs/x.md#y) and [c](#z)"),
        ["docs/x.md#y", "#z"]
    );
    let a = anchors("# Top\n```sh\n# not a heading\n```\n## What `replay` computes\n");
    assert!(a.contains("top") && a.contains("what-replay-computes"));
    assert!(!a.contains("not-a-heading"));
    assert_eq!(
        lexical(Path::new("/r/docs/../README.md")),
        Path::new("/r/README.md")
    );
    assert!(!lexical(Path::new("/r/../shared/p.txt")).starts_with("/r"));
}
