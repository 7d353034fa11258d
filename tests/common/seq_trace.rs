//! A small trace for the train/eval/serve tests, imported through the real
//! binary from SASRec-style `user item` lines.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::cli::{grflow, ok};

/// Writes `users` walks (user u visits i, i+3, i+6, ... over `items` items,
/// 8-12 steps) to `dir/name.txt` and imports them with `tables` embedding
/// tables into `dir/name`.
pub fn import_walks(dir: &Path, name: &str, users: u32, items: u32, tables: u32) -> PathBuf {
    let input = dir.join(format!("{name}.txt"));
    let mut text = String::new();
    for u in 0..users {
        for s in 0..8 + u % 5 {
            writeln!(text, "{} {}", u + 1, (u * 7 + s * 3) % items + 1).unwrap();
        }
    }
    std::fs::write(&input, text).unwrap();
    let trace = dir.join(name);
    ok(grflow()
        .args(["import", "--format", "seq", "--quiet", "--tables"])
        .arg(tables.to_string())
        .arg("--input")
        .arg(&input)
        .arg("--out")
        .arg(&trace)
        .output()
        .unwrap());
    trace
}
