//! Records the commit this binary was built from (`GRFLOW_COMMIT`), so a
//! trained model names the code that trained it rather than whatever the
//! working directory holds when training ends.

use std::process::Command;

fn main() {
    // A commit or checkout moves HEAD or the branch it names.
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    println!("cargo:rerun-if-changed=.git/packed-refs");
    println!("cargo:rerun-if-changed=build.rs");
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=GRFLOW_COMMIT={commit}");
}
