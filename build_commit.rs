// The commit the code is built from, shared by two build scripts through
// `include!`: the binary's (`build.rs`, `GRFLOW_COMMIT`, which a trained
// model records) and grflow-pipeline's (`pipeline/build.rs`,
// `GRFLOW_BUILD_COMMIT`, which the cluster handshake compares). One
// implementation, so that both name a commit the same way.

/// `git` run in `dir`, its trimmed stdout when it succeeds.
fn git(dir: &std::path::Path, args: &[&str]) -> Option<String> {
    std::process::Command::new("git")
        .current_dir(dir)
        // Never take the index lock (a `git diff` may refresh the index):
        // a build must not get in the way of git commands run meanwhile.
        .env("GIT_OPTIONAL_LOCKS", "0")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// The short commit of HEAD in the repository holding `dir`; "unknown"
/// outside git (a source archive) or without a `git` program.
fn git_commit(dir: &std::path::Path) -> String {
    git(dir, &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
}

/// Tells cargo to run the build script again when HEAD moves (a commit, a
/// checkout, a reset): the repository's HEAD, its branch refs and packed
/// refs. Only paths that exist are named: cargo runs a build script whose
/// watched path is missing on every build, and everything that depends
/// on it is then compiled again.
fn watch_git_head(dir: &std::path::Path) {
    let Some(dirs) = git(
        dir,
        &[
            "rev-parse",
            "--path-format=absolute",
            "--git-dir",
            "--git-common-dir",
        ],
    ) else {
        return;
    };
    let mut dirs = dirs.lines().map(std::path::PathBuf::from);
    let (Some(git_dir), Some(common)) = (dirs.next(), dirs.next()) else {
        return;
    };
    // A worktree's HEAD is its own; the refs are the repository's.
    for path in [
        git_dir.join("HEAD"),
        common.join("refs").join("heads"),
        common.join("packed-refs"),
    ] {
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
