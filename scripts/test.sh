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
for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$TANSU_PORT") 2>/dev/null; then
        break
    fi
    if ! kill -0 "$tansu_pid" 2>/dev/null; then
        echo "tansu exited:" >&2
        cat "$tansu_dir/tansu.log" >&2
        exit 1
    fi
    sleep 0.1
done
export GRFLOW_KAFKA_BROKERS="127.0.0.1:$TANSU_PORT"

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
