//! Records the commit this binary was built from (`GRFLOW_COMMIT`), so a
//! trained model names the code that trained it rather than whatever the
//! working directory holds when training ends. The commit is found as
//! grflow-pipeline's build script finds it (`build_commit.rs`, shared).

include!("build_commit.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build_commit.rs");
    let dir = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    // A commit or checkout moves HEAD or the branch it names.
    watch_git_head(&dir);
    println!("cargo:rustc-env=GRFLOW_COMMIT={}", git_commit(&dir));
}
