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
# Best effort (no rustup with a distro cargo, no network): whether the
# tools are there is checked just below.
rustup_err=$(rustup component add rustfmt clippy 2>&1 >/dev/null) || true

# Without rustfmt or clippy their checks cannot run: each is then skipped
# with a visible SKIPPED line (and rustup's reason), not silently. It does
# not fail the run: the tests themselves still say whether the code works.
have_fmt=false
have_clippy=false
if cargo fmt --version >/dev/null 2>&1; then have_fmt=true; fi
if cargo clippy --version >/dev/null 2>&1; then have_clippy=true; fi
if [ "$have_fmt" != true ] || [ "$have_clippy" != true ]; then
    echo "== WARNING: rustfmt or clippy is missing; their checks will be SKIPPED${rustup_err:+ (rustup: $rustup_err)}" >&2
fi

started=$(date +%s)

# librdkafka is built with TLS (rdkafka's `ssl` feature), which links the
# system OpenSSL: its headers and pkg-config must be there.
if ! pkg-config --exists openssl 2>/dev/null; then
    log "installing OpenSSL headers and pkg-config (librdkafka's TLS)"
    if command -v apt-get >/dev/null 2>&1; then
        sudo_cmd=""
        if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
        $sudo_cmd apt-get update -qq && $sudo_cmd apt-get install -y -qq libssl-dev pkg-config
    else
        echo "OpenSSL development files (libssl-dev or openssl-devel) and pkg-config are required" >&2
        exit 1
    fi
fi

# The broker the Kafka tests talk to: tansu, a Kafka-compatible broker
# (in-memory storage), on 127.0.0.1 only. Installed once (10-20 min cold).
TANSU_VERSION=0.6.0
TANSU_PORT=${TANSU_PORT:-19092}
if ! command -v tansu >/dev/null 2>&1 || ! tansu --version 2>/dev/null | grep -q "$TANSU_VERSION"; then
    log "installing tansu $TANSU_VERSION (Kafka-compatible broker for the integration tests)"
    cargo install tansu --version "$TANSU_VERSION" --features dynostore --locked
fi
export PATH="$HOME/.cargo/bin:$PATH"

tansu_dir=$(mktemp -d)
tansu_pid=""
stop_tansu() {
    if [ -n "$tansu_pid" ] && kill -0 "$tansu_pid" 2>/dev/null; then
        kill "$tansu_pid" 2>/dev/null || true
        wait "$tansu_pid" 2>/dev/null || true
    fi
    rm -rf "$tansu_dir"
}
trap stop_tansu EXIT

log "starting tansu on 127.0.0.1:$TANSU_PORT"
(
    cd "$tansu_dir"
    exec tansu broker \
        --listener-url "tcp://127.0.0.1:$TANSU_PORT" \
        --advertised-listener-url "tcp://127.0.0.1:$TANSU_PORT" \
        --storage-engine memory://tansu/
) >"$tansu_dir/tansu.log" 2>&1 &
tansu_pid=$!
tansu_up=false
for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$TANSU_PORT") 2>/dev/null; then
        tansu_up=true
        break
    fi
    if ! kill -0 "$tansu_pid" 2>/dev/null; then
        echo "tansu exited:" >&2
        cat "$tansu_dir/tansu.log" >&2
        exit 1
    fi
    sleep 0.1
done
# Stop here rather than let the Kafka tests fail later on topic creation.
if [ "$tansu_up" != true ]; then
    echo "tansu is not listening on 127.0.0.1:$TANSU_PORT after 30 s; the end of its log:" >&2
    tail -n 50 "$tansu_dir/tansu.log" >&2
    exit 1
fi
export GRFLOW_KAFKA_BROKERS="127.0.0.1:$TANSU_PORT"

if [ "$have_fmt" = true ]; then
    log "cargo fmt --check"
    cargo fmt --all -- --check
else
    log "SKIPPED: cargo fmt --check (rustfmt is not installed: rustup component add rustfmt)"
fi

if [ "$have_clippy" = true ]; then
    log "cargo clippy (warnings are errors)"
    cargo clippy --workspace --all-targets --locked -- -D warnings
else
    log "SKIPPED: cargo clippy (clippy is not installed: rustup component add clippy)"
fi

# The crates' docs are how a successor reads the code: a link that names
# nothing (or a private item) fails here, not in someone's browser.
log "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

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
