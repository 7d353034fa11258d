//! The build this crate is compiled from (`GRFLOW_BUILD_COMMIT`), which the
//! cluster handshake compares (`src/handshake.rs`): processes built from
//! different code may exchange records (`Routed`, `NodeReport`,
//! `NodeControl`) in different layouts, which timely would decode as
//! garbage. The commit is found as the binary's build script finds it
//! (`build_commit.rs` at the workspace root, shared); a build with
//! uncommitted changes to the code adds `-dirty.` and a digest of them.

include!("../build_commit.rs");

/// The crates the pipeline is built from, itself included: their sources
/// and manifests, with the workspace's manifest and lock file, are its
/// code (their tests and benches are not: an edit there compiles the
/// pipeline again only if it had to be anyway).
const CRATES: [&str; 6] = [
    "kernels",
    "operators",
    "traces",
    "connectors",
    "train",
    "pipeline",
];

/// The paths of the pipeline's code, relative to the workspace root.
fn code() -> Vec<String> {
    let mut paths = vec!["Cargo.toml".to_string(), "Cargo.lock".to_string()];
    for c in CRATES {
        paths.push(format!("{c}/Cargo.toml"));
        paths.push(format!("{c}/build.rs"));
        paths.push(format!("{c}/src"));
    }
    paths
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../build_commit.rs");
    let manifest =
        std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest.parent().unwrap_or(&manifest).to_path_buf();
    watch_git_head(&root);
    let mut commit = git_commit(&root);
    if commit != "unknown" {
        // An edit to the code runs this again, so the digest follows
        // uncommitted changes (the crates are compiled again then anyway).
        let code = code();
        for path in code.iter().map(|p| root.join(p)) {
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
        let mut args = vec!["diff", "--no-ext-diff", "--no-color", "HEAD", "--"];
        args.extend(code.iter().map(String::as_str));
        if let Some(diff) = git(&root, &args)
            && !diff.is_empty()
        {
            let digest = diff.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
            });
            commit = format!("{commit}-dirty.{:08x}", digest >> 32);
        }
    }
    println!("cargo:rustc-env=GRFLOW_BUILD_COMMIT={commit}");
}
